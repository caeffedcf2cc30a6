"""``Story``: a turn's events as the parts a chat front end draws, each exactly once,
for a stream that watched the turn from its start and for one that joined late."""

from __future__ import annotations

from turnkit import (
    ActionCompletedEvent,
    ActionRequestedEvent,
    AssistantMessage,
    InputRequest,
    InputRequestedEvent,
    MessageCompletedEvent,
    MessageDeltaEvent,
    ToolCall,
    TurnCompletedEvent,
    TurnEvent,
)
from turnkit.server._story import (
    Asked,
    Ended,
    Item,
    Story,
    TextAdded,
    TextClosed,
    TextOpened,
    ToolCalled,
    ToolReturned,
)

T, S = "t1", "s1"


def delta(text: str, place: int, attempt: str = "a1") -> MessageDeltaEvent:
    return MessageDeltaEvent(turn_id=T, session_id=S, text=text, next_seq=place, attempt=attempt)


def completed(text: str, seq: int, calls: tuple[ToolCall, ...] = ()) -> MessageCompletedEvent:
    message = AssistantMessage(text=text, turn_id=T, tool_calls=calls)
    return MessageCompletedEvent(turn_id=T, session_id=S, seq=seq, message=message)


def told(story: Story, events: list[TurnEvent]) -> list[Item]:
    items: list[Item] = []
    for event in events:
        items.extend(story.tell(event))
    return [*items, *story.end()]


def shown(items: list[Item]) -> dict[str, str]:
    """Each text part's text, as a client that hides superseded parts shows it."""
    texts: dict[str, str] = {}
    hidden: set[str] = set()
    for item in items:
        if isinstance(item, TextOpened):
            texts[item.part] = ""
        elif isinstance(item, TextAdded):
            texts[item.part] += item.text
        elif isinstance(item, TextClosed) and item.superseded:
            hidden.add(item.part)
    return {k: v for k, v in texts.items() if k not in hidden}


def test_a_watched_turn_streams_its_text_and_completes_it_once() -> None:
    call = ToolCall(id="c1", name="weigh", input={"item": "x"})
    events: list[TurnEvent] = [
        delta("Let ", 2),
        delta("me look.", 2),
        completed("Let me look.", 2, (call,)),
        ActionRequestedEvent(turn_id=T, session_id=S, seq=3, call=call),
        ActionCompletedEvent(turn_id=T, session_id=S, seq=4, call_id="c1", name="weigh", result=2),
        delta("Done.", 5),
        completed("Done.", 5),
        TurnCompletedEvent(turn_id=T, session_id=S, seq=6, text="Done."),
    ]
    items = told(Story(T), events)
    assert list(shown(items).values()) == ["Let me look.", "Done."]
    assert [i for i in items if isinstance(i, ToolCalled | ToolReturned)] == [
        ToolCalled(call=call, message_id="t1:2"),
        ToolReturned(call_id="c1", name="weigh", result=2, error=None),
    ]
    assert items[-1] == Ended(how="completed", detail="Done.")


def test_a_late_stream_draws_the_step_it_joined_whole_and_streams_the_next() -> None:
    events: list[TurnEvent] = [
        delta("upon a time.", 2),  # the first words were streamed before it listened
        completed("Once upon a time.", 2),
        delta("The ", 4),
        delta("end.", 4),
        completed("The end.", 4),
        TurnCompletedEvent(turn_id=T, session_id=S, seq=5, text="The end."),
    ]
    items = told(Story(T, joined_late=True), events)
    assert list(shown(items).values()) == ["Once upon a time.", "The end."]
    assert [i.text for i in items if isinstance(i, TextAdded)] == [
        "Once upon a time.",
        "The ",
        "end.",
    ]


def test_a_new_attempt_voids_what_the_old_one_streamed() -> None:
    events: list[TurnEvent] = [
        delta("Hel", 2, attempt="a1"),
        delta("Hi ", 2, attempt="a2"),  # taken over mid-reply: the step starts again
        delta("lo", 2, attempt="a1"),  # a late delta of the dead attempt
        delta("there.", 2, attempt="a2"),
        completed("Hi there.", 2),
        TurnCompletedEvent(turn_id=T, session_id=S, seq=3, text="Hi there."),
    ]
    items = told(Story(T), events)
    assert list(shown(items).values()) == ["Hi there."]
    superseded = [i for i in items if isinstance(i, TextClosed) and i.superseded]
    assert len(superseded) == 1


def test_a_park_asks_each_question_once() -> None:
    request = InputRequest(id="q", prompt="ok?", turn_id=T, call_id="c1", tool="refund")
    asked = InputRequestedEvent(turn_id=T, session_id=S, seq=4, request=request)
    again = InputRequestedEvent(turn_id=T, session_id=S, seq=6, request=request, still_open=True)
    items = told(Story(T), [asked, again])
    assert [i for i in items if isinstance(i, Asked)] == [Asked(requests=(request,))]
    assert items[-1] == Ended(how="parked")
