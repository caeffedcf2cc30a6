"""``--otel`` on ``turnkit run`` and ``turnkit dev``: trace the command's turns.

Tracing is opt-in. With the flag, the runtime gets an ``OtelTracer``; unless the
process already has a tracer provider (``opentelemetry-instrument``, your own
``sitecustomize``), the SDK's is set up here from the standard ``OTEL_*``
variables: ``OTEL_TRACES_EXPORTER`` (``console``, the default here, printing each
span to stderr; ``otlp``; ``none``; or several, comma-separated), the OTLP
exporter's own ``OTEL_EXPORTER_OTLP_*`` settings, ``OTEL_SERVICE_NAME`` and
``OTEL_RESOURCE_ATTRIBUTES``, ``OTEL_TRACES_SAMPLER``. See ``docs/tracing.md``.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from importlib import import_module
from typing import Any

from .._seams.tracer import Tracer
from ._store import CliError

#: The exporter when ``OTEL_TRACES_EXPORTER`` is not set (the specification's
#: default is ``otlp``; a command run by hand shows its spans instead).
DEFAULT_EXPORTER = "console"


@contextmanager
def otel_tracing(command: str) -> Iterator[Tracer]:
    """An ``OtelTracer`` for ``turnkit <command> --otel``; on exit, the spans the
    provider set up here still holds are exported."""
    try:
        from opentelemetry import trace

        from ..otel import OtelTracer
    except ImportError:
        raise CliError(
            f"turnkit {command} --otel needs OpenTelemetry: "
            "pip install 'turnkit[otel]' opentelemetry-sdk"
        ) from None
    if not isinstance(trace.get_tracer_provider(), trace.ProxyTracerProvider):
        yield OtelTracer()  # the process configured its own: use it as it is
        return
    provider = _sdk_provider(command)
    trace.set_tracer_provider(provider)
    try:
        yield OtelTracer(provider)
    finally:
        provider.shutdown()


def _sdk_provider(command: str) -> Any:
    """The SDK's tracer provider with the exporters ``OTEL_TRACES_EXPORTER`` names."""
    try:
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import (
            BatchSpanProcessor,
            ConsoleSpanExporter,
            SimpleSpanProcessor,
        )
    except ImportError:
        raise CliError(
            f"turnkit {command} --otel needs the OpenTelemetry SDK to record spans: "
            "pip install opentelemetry-sdk"
        ) from None
    named = os.environ.get("OTEL_TRACES_EXPORTER") or DEFAULT_EXPORTER
    exporters = [name.strip().lower() for name in named.split(",") if name.strip()]
    unknown = sorted(set(exporters) - {"console", "otlp", "none"})
    if unknown:
        raise CliError(
            f"OTEL_TRACES_EXPORTER={named!r}: turnkit --otel knows console, otlp and "
            f"none, not {', '.join(unknown)}"
        )
    processors: list[Any] = []
    if "console" in exporters:
        # stderr: on ``turnkit run`` stdout carries the turn.
        processors.append(SimpleSpanProcessor(ConsoleSpanExporter(out=sys.stderr)))
    if "otlp" in exporters:
        processors.append(BatchSpanProcessor(_otlp_exporter(command)))
    provider = TracerProvider(resource=Resource.create(_default_service()))
    for processor in processors:
        provider.add_span_processor(processor)
    return provider


def _default_service() -> dict[str, str]:
    """``service.name = turnkit`` unless the environment names the service."""
    if os.environ.get("OTEL_SERVICE_NAME") or "service.name=" in os.environ.get(
        "OTEL_RESOURCE_ATTRIBUTES", ""
    ):
        return {}
    return {"service.name": "turnkit"}


def _otlp_exporter(command: str) -> Any:
    """The OTLP span exporter for the protocol the environment asks for (it reads
    its endpoint, headers and the rest from ``OTEL_EXPORTER_OTLP_*`` itself)."""
    protocol = (
        os.environ.get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL")
        or os.environ.get("OTEL_EXPORTER_OTLP_PROTOCOL")
        or "http/protobuf"
    )
    modules = {
        "grpc": ("opentelemetry-exporter-otlp-proto-grpc", "grpc"),
        "http/protobuf": ("opentelemetry-exporter-otlp-proto-http", "http"),
    }
    if protocol not in modules:
        raise CliError(
            f"OTEL_EXPORTER_OTLP_PROTOCOL={protocol!r}: turnkit --otel sends grpc or http/protobuf"
        )
    package, kind = modules[protocol]
    try:
        module = import_module(f"opentelemetry.exporter.otlp.proto.{kind}.trace_exporter")
    except ImportError:
        raise CliError(
            f"turnkit {command} --otel with OTEL_TRACES_EXPORTER=otlp ({protocol}) needs "
            f"the OTLP exporter: pip install {package}"
        ) from None
    return module.OTLPSpanExporter()
