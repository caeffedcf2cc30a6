// Drives turnkit's AI SDK endpoints with the AI SDK's own chat client (AbstractChat
// and DefaultChatTransport from `ai`), headless. One scenario per run:
//   node aisdk_client.mjs SCENARIO BASE_URL AGENT USER CHAT_ID
// Prints one JSON object per line: progress lines ({"event": ...}) the test reacts
// to, then {"event": "result", ...} with the chat's messages as the SDK holds them.
import {
  AbstractChat,
  DefaultChatTransport,
  lastAssistantMessageIsCompleteWithApprovalResponses,
} from "ai";

// An optional sixth argument is another HTTP node's base URL: the reconnect goes there.
const [scenario, base, agent, user, chatId, reconnectBase] = process.argv.slice(2);
const api = `${base}/agents/${agent}/ai-sdk/chat`;
const say = (line) => process.stdout.write(JSON.stringify(line) + "\n");

class State {
  constructor(onChange) {
    this.messages = [];
    this._status = "ready";
    this.error = undefined;
    this.onChange = onChange;
  }
  get status() {
    return this._status;
  }
  set status(status) {
    this._status = status;
    this.onChange(this.messages);
  }
  pushMessage(message) {
    this.messages = this.messages.concat(message);
    this.onChange(this.messages);
  }
  popMessage() {
    this.messages = this.messages.slice(0, -1);
  }
  replaceMessage(index, message) {
    this.messages = [...this.messages.slice(0, index), message, ...this.messages.slice(index + 1)];
    this.onChange(this.messages);
  }
  snapshot(thing) {
    return structuredClone(thing);
  }
}

class Chat extends AbstractChat {
  constructor({ onChange, ...init }) {
    super({ ...init, state: new State(onChange) });
  }
}

// A fetch that can drop the response it is reading, as a broken connection would:
// the SDK sees a network TypeError, the server sees the client go away.
let live = null;
async function droppableFetch(url, init) {
  const response = await fetch(url, init);
  say({ event: "response", method: init.method ?? "GET", status: response.status });
  if (!response.body) return response;
  const reader = response.body.getReader();
  let controller;
  const body = new ReadableStream({
    start(c) {
      controller = c;
    },
    async pull(c) {
      try {
        const { done, value } = await reader.read();
        if (done) c.close();
        else c.enqueue(value);
      } catch (error) {
        c.error(error);
      }
    },
  });
  live = {
    drop() {
      controller.error(new TypeError("network error: the connection dropped"));
      reader.cancel().catch(() => {});
    },
  };
  return new Response(body, { status: response.status, headers: response.headers });
}

function textOf(messages) {
  const last = messages.at(-1);
  if (!last || last.role !== "assistant") return "";
  return last.parts.filter((p) => p.type === "text").map((p) => p.text).join("");
}

function waitFor(predicate, what, seconds = 30) {
  return new Promise((resolve, reject) => {
    const timer = setTimeout(() => reject(new Error(`timed out waiting for ${what}`)), seconds * 1000);
    const check = () => {
      if (predicate()) {
        clearTimeout(timer);
        resolve();
        return true;
      }
      return false;
    };
    if (!check()) watchers.push(check);
  });
}
let watchers = [];
const changed = () => {
  watchers = watchers.filter((check) => !check());
};

const chat = new Chat({
  id: chatId,
  transport: new DefaultChatTransport({
    api,
    headers: { "X-User": user },
    fetch: droppableFetch,
    prepareReconnectToStreamRequest: reconnectBase
      ? ({ id }) => ({ api: `${reconnectBase}/agents/${agent}/ai-sdk/chat/${encodeURIComponent(id)}/stream` })
      : undefined,
  }),
  sendAutomaticallyWhen: lastAssistantMessageIsCompleteWithApprovalResponses,
  onChange: changed,
  onError: (error) => say({ event: "error", message: String(error.message ?? error) }),
});

function approvals() {
  const last = chat.messages.at(-1);
  return (last?.parts ?? []).filter((p) => p.state === "approval-requested");
}

async function settle() {
  await waitFor(() => chat.status === "ready" || chat.status === "error", "the chat to settle");
}

async function main() {
  if (["two-tools", "approve", "refuse", "ship-approve", "ship-reject"].includes(scenario)) {
    const text = {
      "two-tools": "weigh and price a widget",
      approve: "refund A-1",
      refuse: "refund for the lead A-2",
      "ship-approve": "ship A-7",
      "ship-reject": "ship A-8",
    }[scenario];
    await chat.sendMessage({ text });
    if (scenario !== "two-tools") {
      const asked = approvals();
      say({ event: "asked", approvals: asked.map((p) => p.approval.id) });
      for (const part of asked) {
        if (scenario === "ship-reject") {
          await chat.addToolApprovalResponse({ id: part.approval.id, approved: false, reason: "no stock" });
        } else {
          await chat.addToolApprovalResponse({ id: part.approval.id, approved: true });
        }
      }
      // The SDK sends the answers by itself (sendAutomaticallyWhen).
      await waitFor(() => chat.status !== "ready" || chat.error, "the answer to be sent");
      await settle();
    }
  } else if (scenario === "drop") {
    const sent = chat.sendMessage({ text: "tell a slow story" });
    await waitFor(() => textOf(chat.messages).length > 0, "the first words");
    say({ event: "seen", text: textOf(chat.messages) });
    live.drop();
    await sent;
    say({ event: "dropped", status: chat.status });
    await chat.resumeStream();
  } else if (scenario === "stop") {
    const sent = chat.sendMessage({ text: "tell a slow story" });
    await waitFor(() => textOf(chat.messages).length > 0, "the first words");
    const stopped = await fetch(`${api}/${encodeURIComponent(chatId)}/stop`, {
      method: "POST",
      headers: { "X-User": user },
    });
    say({ event: "stopped", status: stopped.status, body: await stopped.json() });
    await sent;
  } else if (scenario === "watch") {
    // Says the reply's text parts each time they change (superseded ones marked), so
    // the test can pace the model and kill the worker running it mid-reply.
    let said = "";
    watchers.push(() => {
      const last = chat.messages.at(-1);
      if (last?.role !== "assistant") return false;
      const parts = last.parts
        .filter((p) => p.type === "text")
        .map((p) => ({ text: p.text, superseded: p.providerMetadata?.turnkit?.superseded === true }));
      const line = JSON.stringify(parts);
      if (line !== said) {
        said = line;
        say({ event: "text", parts });
      }
      return false; // keep watching
    });
    await chat.sendMessage({ text: "hi" });
  } else {
    throw new Error(`unknown scenario ${scenario}`);
  }
  say({
    event: "result",
    status: chat.status,
    error: chat.error ? String(chat.error.message) : null,
    messages: chat.messages,
  });
}

main().catch((error) => {
  say({ event: "failed", message: String(error.stack ?? error) });
  process.exit(1);
});
