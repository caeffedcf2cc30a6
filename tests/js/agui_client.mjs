// Drives turnkit's AG-UI endpoint with the official client (`@ag-ui/client`'s
// HttpAgent.runAgent), headless. One scenario per run:
//   node agui_client.mjs SCENARIO BASE_URL AGENT USER THREAD_ID
// Prints one JSON object per line: progress lines the test reacts to, then
// {"event": "result", ...} with the agent's messages and each run's events.
import { HttpAgent, buildResumeArray } from "@ag-ui/client";

const [scenario, base, agentName, user, threadId] = process.argv.slice(2);
const say = (line) => process.stdout.write(JSON.stringify(line) + "\n");

const agent = new HttpAgent({
  url: `${base}/agents/${agentName}/ag-ui`,
  headers: { "X-User": user },
  threadId,
});

const runs = [];
async function run(parameters = {}, onEvent = () => {}) {
  const events = [];
  let failure = null;
  try {
    await agent.runAgent(parameters, {
      onEvent: ({ event }) => {
        events.push(event);
        onEvent(event);
      },
    });
  } catch (error) {
    failure = String(error.message ?? error);
  }
  const finished = events.find((e) => e.type === "RUN_FINISHED");
  const summary = {
    types: events.map((e) => e.type),
    outcome: finished?.outcome ?? null,
    result: finished?.result ?? null,
    error: failure ?? events.find((e) => e.type === "RUN_ERROR")?.message ?? null,
    pending: agent.pendingInterrupts.map((i) => i.id),
  };
  runs.push(summary);
  say({ event: "run", ...summary });
  return summary;
}

async function main() {
  const text = {
    "two-tools": "weigh and price a widget",
    approve: "refund A-1",
    refuse: "refund for the lead A-2",
    "ship-edit": "ship A-5",
    "ship-reject": "ship A-6",
    stop: "tell a slow story",
    capabilities: null,
  }[scenario];
  if (scenario === "capabilities") {
    const response = await fetch(`${base}/agents/${agentName}/ag-ui/capabilities`, {
      headers: { "X-User": user },
    });
    say({ event: "result", status: response.status, capabilities: await response.json() });
    return;
  }
  if (text === undefined) throw new Error(`unknown scenario ${scenario}`);
  agent.addMessage({ id: `u-${scenario}`, role: "user", content: text });
  let stopping = null;
  const first = await run({}, (event) => {
    if (scenario === "stop" && event.type === "TEXT_MESSAGE_CONTENT" && stopping === null) {
      // turnkit's durable cancel, on the thread's session: the run ends at the next boundary.
      stopping = fetch(`${base}/agents/${agentName}/sessions/${threadId}/cancel`, {
        method: "POST",
        headers: { "X-User": user },
      }).then(async (response) => say({ event: "stopped", status: response.status, body: await response.json() }));
    }
  });
  await stopping;
  if (scenario === "approve" || scenario === "refuse") {
    const answers = Object.fromEntries(
      agent.pendingInterrupts.map((i) => [i.id, { status: "resolved", payload: true }]),
    );
    await run({ resume: buildResumeArray(agent.pendingInterrupts, answers) });
  }
  if (scenario === "ship-edit" || scenario === "ship-reject") {
    // A tool_call interrupt: approve with edits (AG-UI's editedArgs), or reject with a reason.
    const payload = scenario === "ship-edit"
      ? (i) => ({ approved: true, editedArgs: { ...i.metadata.turnkit.arguments, address: "New Street 2" } })
      : () => ({ approved: false, reason: "no stock" });
    const answers = Object.fromEntries(
      agent.pendingInterrupts.map((i) => [i.id, { status: "resolved", payload: payload(i) }]),
    );
    await run({ resume: buildResumeArray(agent.pendingInterrupts, answers) });
  }
  say({ event: "result", first, runs, messages: agent.messages });
}

main().catch((error) => {
  say({ event: "failed", message: String(error.stack ?? error) });
  process.exit(1);
});
