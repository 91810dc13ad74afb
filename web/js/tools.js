// Tools in the chat: the functions a turn offers (the settings' JSON list, OpenAI's shape), the calls a reply made,
// shown as cards, and the form that answers them (tool.results). Everything the model or a tool wrote is shown
// with textContent, never as markup.

/** {tools} from the settings' text (null when empty), or {error}: a JSON list of {"type": "function", "function":
 *  {"name", ...}} definitions, as docs/protocol.md takes them. */
export function parseTools(text) {
  if (!text.trim()) return { tools: null };
  let value;
  try {
    value = JSON.parse(text);
  } catch (e) {
    return { error: `Tools must be JSON: ${e.message}` };
  }
  if (!Array.isArray(value) || !value.length) return { error: "Tools must be a JSON list of function definitions." };
  for (const [i, tool] of value.entries()) {
    if (!tool || tool.type !== "function" || typeof tool.function?.name !== "string") {
      return { error: `Tool ${i + 1} must be {"type": "function", "function": {"name": ..., "parameters": ...}}.` };
    }
  }
  return { tools: value };
}

/** The card of one call a reply made: its function's name, its id, its arguments (pretty when they are JSON). */
export function toolCallCard(call) {
  const card = document.createElement("div");
  card.className = "tool-call";
  card.dataset.name = call.function?.name ?? "";
  card.dataset.callId = call.id ?? "";
  const head = document.createElement("p");
  head.className = "tool-call-head";
  const name = document.createElement("span");
  name.className = "tool-name";
  name.textContent = call.function?.name ?? "?";
  head.append("Tool call: ", name);
  const args = document.createElement("pre");
  args.className = "tool-args";
  args.textContent = prettyJson(call.function?.arguments ?? "");
  card.append(head, args);
  return card;
}

/** The card of a tool's result (a `tool` message of the conversation). */
export function toolResultCard(message) {
  const card = document.createElement("div");
  card.className = "tool-result";
  const head = document.createElement("p");
  head.className = "tool-call-head";
  head.textContent = "Tool result";
  const body = document.createElement("pre");
  body.className = "tool-output";
  body.textContent = typeof message.content === "string" ? prettyJson(message.content) : "";
  card.append(head, body);
  return card;
}

/** A form with one result box per call of the last reply; `on.submit([{tool_call_id, content}])`. */
export function toolResultsForm(calls, on) {
  const form = document.createElement("form");
  form.className = "msg tool-results";
  form.setAttribute("aria-label", "Tool results");
  const hint = document.createElement("p");
  hint.className = "hint";
  hint.textContent = "The reply called tools. Give each call's result to go on.";
  form.append(hint);
  const areas = calls.map((call, i) => {
    const label = document.createElement("label");
    label.textContent = `Result of ${call.function?.name ?? "the call"}`;
    const area = document.createElement("textarea");
    area.rows = 2;
    area.id = label.htmlFor = `tool-result-${i}`;
    form.append(label, area);
    return area;
  });
  const send = document.createElement("button");
  send.type = "submit";
  send.className = "primary";
  send.textContent = "Send results";
  form.append(send);
  form.addEventListener("submit", (e) => {
    e.preventDefault();
    on.submit(calls.map((call, i) => ({ tool_call_id: call.id, content: areas[i].value })));
  });
  return form;
}

function prettyJson(text) {
  try {
    return JSON.stringify(JSON.parse(text), null, 2);
  } catch {
    return text;
  }
}
