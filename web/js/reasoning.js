// A thinking model's reply: `<think> ... </think>` before the answer. The thinking is shown folded, apart from the
// answer (which alone is copied); while the reply streams, an open thinking block is shown as it grows.

const START = "<think>";
const END = "</think>";

/** {reasoning, answer, thinking} of a reply: reasoning null when the reply does not open with <think>; thinking
 *  true while the block is still open (a reply being streamed, or one cut inside its thinking). */
export function splitThinking(text) {
  const body = text.trimStart();
  if (!body.startsWith(START)) {
    // a reply still writing its first characters may be opening the block: show nothing of it yet
    return START.startsWith(body) && body ? { reasoning: "", answer: "", thinking: true } : { reasoning: null, answer: text, thinking: false };
  }
  const rest = body.slice(START.length);
  const at = rest.indexOf(END);
  if (at < 0) return { reasoning: rest.replace(/^\n+/, ""), answer: "", thinking: true };
  return {
    reasoning: rest.slice(0, at).replace(/^\n+|\n+$/g, ""),
    answer: rest.slice(at + END.length).replace(/^\n+/, ""),
    thinking: false,
  };
}

/** The folded box of a reply's thinking: plain text (never markup), open while the model is still thinking. */
export function reasoningBox(reasoning, thinking) {
  const box = document.createElement("details");
  box.className = "reasoning";
  box.open = thinking;
  const summary = document.createElement("summary");
  summary.textContent = thinking ? "Thinking…" : "Thought";
  const body = document.createElement("div");
  body.className = "plain";
  body.textContent = reasoning;
  box.append(summary, body);
  return box;
}
