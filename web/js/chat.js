// The chat controller: the client side of the session protocol (docs/protocol.md), with no DOM in it.
//
// It mirrors the server's session state machine (chat/protocol/session.py): the committed conversation changes
// only when a turn ends, exactly as the server commits it, so no conversation.get is needed after a turn:
//
//   reply.done with message_id:  create:     messages + user + reply
//                                regenerate: messages[:-1] + reply
//                                edit at i:  messages[:i] + edited user + reply
//                                tool.results: messages + tool results + reply
//   reply.done without one (cancelled before any text, or failed): messages unchanged
//
// conversation.get is sent after session.resume (page load, reopening a past chat, reconnecting).
//
// Events dispatched (CustomEvent): "change" (anything shown changed; re-render), "delta" (the streaming reply
// grew; detail = turn), "session" (a session was created or resumed; detail = SessionInfo), "notice" (detail =
// {text, level}), "restore" (a message was refused; detail = {text} to put back in the composer), "done" (a turn
// ended; detail = reply.done event).

import { compactStats } from "./stats.js";
import { splitContent } from "./media.js";

const RESYNC_MS = 400; // re-ask for the conversation while the server still finishes a turn from a dropped socket
const MAX_RESYNC = 25;

const FRIENDLY = {
  invalid_media: (m) => `An attachment could not be used: ${m}`,
  busy: () => "A reply is still being generated. Stop it or wait for it to finish.",
  context_overflow: (m) => `The conversation is too long: ${m}`,
  frame_too_large: () => "The message is too large to send (attachments included).",
  unknown_model: (m) => `That model is not available: ${m}`,
  internal: (m) => `The server failed while answering: ${m}`,
  unauthorized: () => "The server refused the connection (missing or wrong access token).",
};

/** A readable sentence for an `error` event. */
export function friendlyError(ev) {
  const make = FRIENDLY[ev.code];
  const message = String(ev.message ?? "").trim() || ev.code;
  return make ? make(message) : `Error (${ev.code}): ${message}`;
}

export class ChatController extends EventTarget {
  constructor(connection, store, getNewChatSettings, getTurnTools = () => ({})) {
    super();
    this.turnTools = getTurnTools; // () => {tools, tool_choice} offered to each turn ({} : none)
    this.conn = connection; // a Connection (send, isOpen)
    this.store = store; // a LocalStore
    this.newChatSettings = getNewChatSettings; // () => {model, system, sampling} for session.create
    this.session = null; // SessionInfo of the open session
    this.messages = []; // committed conversation: [{id, role, content, finish_reason}]
    this.turn = null; // the turn in progress (see startTurn)
    this.loading = false; // waiting for session.created / session.resumed / conversation
    this.requests = new Map(); // event_id -> {type, ...} of requests whose answer matters
    this.resyncs = 0; // conversation.get repeats while a turn from before a reconnect is still ending
    this.resyncTimer = null; // the next of those
    connection.addEventListener("open", () => this.onOpen());
    connection.addEventListener("message", (e) => this.onEvent(e.detail));
    connection.addEventListener("status", (e) => this.onStatus(e.detail.state));
  }

  // ---------------------------------------------------------------- what the view shows

  get generating() {
    return this.turn !== null;
  }

  /** The messages to show: the committed conversation as the running turn will change it, plus the reply. */
  displayMessages() {
    const t = this.turn;
    const stats = this.session ? this.store.stats(this.session.id) : {};
    const withStats = (m) => ({ ...m, stats: stats[m.id] ?? null });
    if (!t) return this.messages.map(withStats);
    const reply = { id: null, role: "assistant", content: t.text, streaming: true, stats: null };
    return [...this.history(t).map(withStats), reply];
  }

  /** [{p, k}] of the replies in the conversation that have figures, oldest first (the cache chart). */
  series() {
    if (!this.session) return [];
    const stats = this.store.stats(this.session.id);
    return this.messages.filter((m) => m.role === "assistant" && stats[m.id]).map((m) => stats[m.id]);
  }

  // ---------------------------------------------------------------- what a person does

  /** Send a new user message. `draft` is the composer text, put back if the server refuses the message. */
  send(content, draft = "") {
    if (!this.canStartTurn()) return false;
    return this.startTurn({ type: "turn.create", content, ...this.turnTools() }, "create", content, draft);
  }

  regenerate() {
    if (!this.canStartTurn() || this.messages.at(-1)?.role !== "assistant") return false;
    return this.startTurn({ type: "turn.regenerate", ...this.turnTools() }, "regenerate", null, "");
  }

  /** The calls of the last reply, when it made some and nothing answered them yet (else []). */
  pendingCalls() {
    const last = this.messages.at(-1);
    return !this.turn && last?.role === "assistant" && last.tool_calls?.length ? last.tool_calls : [];
  }

  /** Answer the last reply's calls: `results` = [{tool_call_id, content}]; the reply that follows streams. */
  sendToolResults(results) {
    if (!this.canStartTurn() || !this.pendingCalls().length) return false;
    const tools = results.map((r) => ({ id: null, role: "tool", content: r.content, tool_call_id: r.tool_call_id }));
    const event = { type: "tool.results", results, ...this.turnTools() };
    return this.startTurn(event, "tool_results", null, "", null, tools);
  }

  /** Replace the user message `messageId` (and drop everything after it) and answer it again. */
  edit(messageId, content) {
    const at = this.messages.findIndex((m) => m.id === messageId);
    if (!this.canStartTurn() || at < 0 || this.messages[at].role !== "user") return false;
    const event = { type: "turn.edit", message_id: messageId, content, ...this.turnTools() };
    return this.startTurn(event, "edit", content, "", at);
  }

  stop() {
    if (!this.turn) return;
    this.turn.stopping = true;
    this.conn.send(this.turn.turnId ? { type: "turn.cancel", turn_id: this.turn.turnId } : { type: "turn.cancel" });
    this.changed();
  }

  newChat() {
    this.abandonTurn();
    this.session = null;
    this.messages = [];
    this.store.setCurrent(null);
    this.changed();
    this.createSession();
  }

  open(sessionId) {
    if (this.session?.id === sessionId && !this.loading) return;
    this.abandonTurn();
    this.session = null;
    this.messages = [];
    this.changed();
    this.resume(sessionId);
  }

  /** The access token changed: the open session may be another tenant's. Drop it from view; once the connection is
   * open again, onOpen resumes the new token's last session (or creates one). */
  switchAccount() {
    this.abandonTurn();
    this.session = null;
    this.messages = [];
    this.changed();
  }

  forget(sessionId) {
    this.store.forgetSession(sessionId);
    if (this.session?.id === sessionId) this.newChat();
    else this.changed();
  }

  /** Apply new settings to the open session's next turns: {sampling: {...changed fields}} and/or {system}. */
  updateSettings(update) {
    if (!this.session) return;
    const event = { type: "session.update" };
    if (update.sampling) event.sampling = update.sampling;
    if ("system" in update) event.system = update.system;
    this.conn.send(event);
  }

  // ---------------------------------------------------------------- connection

  onOpen() {
    this.requests.clear();
    const id = this.session?.id ?? this.store.current();
    if (id) this.resume(id);
    else this.createSession();
  }

  onStatus(state) {
    if (state !== "waiting" && state !== "closed") return;
    clearTimeout(this.resyncTimer);
    if (this.turn) {
      // The server cancels a dropped connection's turn and keeps its partial text; the resync after
      // session.resume shows what it kept.
      this.turn = null;
      this.notice("The connection dropped during the reply. Reconnecting…", "warning");
    }
    this.loading = true;
    this.changed();
  }

  // ---------------------------------------------------------------- server events

  onEvent(ev) {
    if (!ev || typeof ev.type !== "string") return;
    const request = ev.reply_to ? this.requests.get(ev.reply_to) : undefined;
    if (ev.reply_to && ev.type !== "reply.delta" && ev.type !== "turn.started") this.requests.delete(ev.reply_to);
    switch (ev.type) {
      case "session.created":
      case "session.resumed":
        if (request) this.onSession(ev.session, ev.type === "session.resumed");
        break;
      case "session.updated":
        if (ev.session?.id === this.session?.id) this.session = ev.session;
        break;
      case "conversation":
        this.onConversation(ev);
        break;
      case "turn.started":
        if (this.turn && ev.reply_to === this.turn.eventId) {
          this.turn.turnId = ev.turn_id;
          if (this.turn.user) this.turn.user.id = ev.user_message_id ?? null;
          this.changed();
        }
        break;
      case "reply.delta":
        if (this.turn && ev.turn_id === this.turn.turnId) {
          this.turn.text += ev.delta;
          this.dispatchEvent(new CustomEvent("delta", { detail: this.turn }));
        }
        break;
      case "reply.tool_call":
        if (this.turn && ev.turn_id === this.turn.turnId) this.turn.calls.push(ev.call);
        break;
      case "reply.done":
        if (this.turn && ev.turn_id === this.turn.turnId) this.onDone(ev);
        break;
      case "error":
        this.onError(ev, request);
        break;
      default:
        break; // pong, and event types this page does not know
    }
  }

  onSession(info, resumed) {
    this.session = info;
    this.messages = [];
    this.store.setCurrent(info.id);
    this.dispatchEvent(new CustomEvent("session", { detail: info }));
    if (resumed) this.getConversation();
    else this.loading = false;
    this.changed();
  }

  onConversation(ev) {
    if (ev.session_id !== this.session?.id) return;
    if (!this.turn) this.messages = Array.isArray(ev.messages) ? ev.messages : [];
    if (this.messages.length) this.remember();
    this.loading = false;
    clearTimeout(this.resyncTimer);
    if (ev.generating && !this.turn && this.resyncs < MAX_RESYNC) {
      this.resyncs += 1; // a turn from before a reconnect is still ending; its reply may be committed soon
      this.resyncTimer = setTimeout(() => this.getConversation(), RESYNC_MS);
    } else {
      this.resyncs = 0;
    }
    this.changed();
  }

  onDone(ev) {
    const t = this.turn;
    this.turn = null;
    if (ev.message_id) {
      const reply = { id: ev.message_id, role: "assistant", content: ev.text, finish_reason: ev.finish_reason };
      if (ev.tool_calls?.length) reply.tool_calls = ev.tool_calls;
      const history = this.history(t);
      this.messages = [...history, reply];
      // a message without its id (tool results; a user message when turn.started named none): ask the server
      if (history.some((m) => !m.id)) this.getConversation();
      this.store.saveStats(this.session.id, ev.message_id, compactStats(ev.usage, ev.timings, ev.finish_reason));
      this.remember();
    } else if (ev.finish_reason === "error" && t.draft) {
      this.dispatchEvent(new CustomEvent("restore", { detail: { text: t.draft } }));
    }
    this.dispatchEvent(new CustomEvent("done", { detail: ev }));
    this.changed();
  }

  onError(ev, request) {
    const t = this.turn;
    if (t && ev.turn_id && ev.turn_id === t.turnId) {
      this.notice(friendlyError(ev)); // the turn failed; its reply.done follows
      return;
    }
    if (t && ev.reply_to && ev.reply_to === t.eventId) {
      this.turn = null; // refused before it started
      if (t.draft) this.dispatchEvent(new CustomEvent("restore", { detail: { text: t.draft } }));
      this.notice(friendlyError(ev));
      this.changed();
      return;
    }
    if (request?.type === "session.resume") {
      this.store.forgetSession(request.sessionId);
      this.notice("That chat is no longer on the server (it may have restarted), so a new chat was started.",
        "warning");
      this.session = null;
      this.messages = [];
      this.createSession();
      this.changed();
      return;
    }
    if (ev.code === "not_generating") return; // a Stop that crossed the reply's end
    this.notice(friendlyError(ev));
  }

  // ---------------------------------------------------------------- internals

  canStartTurn() {
    return !this.turn && !this.loading && this.session !== null && this.conn.isOpen;
  }

  startTurn(event, kind, content, draft, editIndex = null, toolResults = []) {
    const eventId = this.conn.send(event);
    if (!eventId) return false;
    this.turn = {
      eventId, // the turn.* event's id; turn.started and refusals answer it
      kind, // "create" | "regenerate" | "edit" | "tool_results"
      toolResults, // tool_results: the tool messages sent
      calls: [], // the reply's calls, from reply.tool_call
      turnId: null, // from turn.started
      user: content === null ? null : { id: null, role: "user", content }, // the new user message, if any
      editIndex, // edit: the index of the message replaced
      text: "", // the reply so far
      draft, // composer text to put back if the message is refused
      stopping: false, // Stop was pressed
    };
    this.changed();
    return true;
  }

  /** Put the open session at the top of the list of past chats, titled by its first user message. */
  remember() {
    const first = this.messages.find((m) => m.role === "user");
    const title = first ? splitContent(first.content).text || "(attachment)" : null;
    this.store.touchSession(this.session.id, { title, model: this.session.model });
  }

  history(t) {
    if (t.kind === "create") return [...this.messages, t.user];
    if (t.kind === "regenerate") return this.messages.slice(0, -1);
    if (t.kind === "tool_results") return [...this.messages, ...t.toolResults];
    return [...this.messages.slice(0, t.editIndex), t.user];
  }

  abandonTurn() {
    if (!this.turn) return;
    this.conn.send({ type: "turn.cancel" });
    this.turn = null;
  }

  createSession() {
    const { model, system, sampling } = this.newChatSettings();
    const event = { type: "session.create", sampling };
    if (model) event.model = model;
    if (system) event.system = system;
    this.request(event);
  }

  resume(sessionId) {
    this.request({ type: "session.resume", session_id: sessionId }, { sessionId });
  }

  getConversation() {
    this.request({ type: "conversation.get" });
  }

  request(event, extra = {}) {
    this.loading = true;
    const eventId = this.conn.send(event);
    if (eventId) this.requests.set(eventId, { type: event.type, ...extra });
  }

  notice(text, level = "error") {
    this.dispatchEvent(new CustomEvent("notice", { detail: { text, level } }));
  }

  changed() {
    this.dispatchEvent(new CustomEvent("change"));
  }
}
