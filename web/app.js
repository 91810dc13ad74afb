// The page: wires the DOM to the chat controller (js/chat.js), the connection (js/connection.js) and the
// cache panel. Every piece of text that came from the server or the model is put in with textContent or
// renderMarkdown (which builds nodes); this file never assigns HTML.

import { CachePanel } from "./js/cache_panel.js";
import { ChatController } from "./js/chat.js";
import { Connection, defaultUrl } from "./js/connection.js";
import { MAX_FRAME_BYTES, MAX_REPLY_TOKENS, MAX_TEMPERATURE, MAX_TEXT_CHARS, MAX_TOP_K } from "./js/limits.js";
import { ACCEPT, buildContent, checkFile, formatBytes, mediaElement, readAttachment } from "./js/media.js";
import { editorArticle, fillStreaming, messageArticle, streamingArticle, updateActions } from "./js/message_view.js";
import { formatNumber } from "./js/stats.js";
import { LocalStore } from "./js/store.js";
import { parseTools, toolResultsForm } from "./js/tools.js";

const METRICS_EVERY_MS = 5000; // cache panel refresh while the page is visible
const isWhole = (v, lo, hi) => Number.isSafeInteger(v) && v >= lo && v <= hi;
// The form's sampling inputs: how to read and check each (the ranges of chat/protocol/sampling.py). An empty
// input takes `empty` when the field has one, else it is an error.
const SAMPLING_FIELDS = {
  temperature: {
    parse: parseFloat, ok: (v) => v >= 0 && v <= MAX_TEMPERATURE, rule: `between 0 and ${MAX_TEMPERATURE}`,
  },
  top_p: { parse: parseFloat, ok: (v) => v > 0 && v <= 1, rule: "above 0 and at most 1" },
  top_k: {
    parse: Number, ok: (v) => isWhole(v, 0, MAX_TOP_K), rule: `a whole number, 0 to ${formatNumber(MAX_TOP_K)}`,
  },
  max_tokens: {
    parse: Number, ok: (v) => isWhole(v, 1, MAX_REPLY_TOKENS),
    rule: `a whole number, 1 to ${formatNumber(MAX_REPLY_TOKENS)}`,
  },
  seed: {
    parse: Number, ok: (v) => isWhole(v, 0, Number.MAX_SAFE_INTEGER), rule: "a whole number ≥ 0, or empty",
    empty: null,
  },
};

const $ = (id) => document.getElementById(id);
const ui = {
  status: $("status"), sidebar: $("sidebar"), cachePanel: $("cache-panel"), scrim: $("scrim"),
  toggleSidebar: $("toggle-sidebar"), toggleCache: $("toggle-cache"), newChat: $("new-chat"),
  sessionList: $("session-list"), noSessions: $("no-sessions"), settings: $("settings"), model: $("model"),
  system: $("system"), settingsError: $("settings-error"), chat: $("chat"), transcript: $("transcript"),
  empty: $("empty"), messages: $("messages"), notice: $("notice"), noticeText: $("notice-text"),
  noticeClose: $("notice-close"), composer: $("composer"), attachments: $("attachments"), attach: $("attach"),
  fileInput: $("file-input"), message: $("message"), send: $("send"), stop: $("stop"), dropOverlay: $("drop-overlay"),
  noChat: $("no-chat"),
};
const MESSAGE_PLACEHOLDER = ui.message.placeholder;

const store = new LocalStore();
const connection = new Connection(socketUrl());
const controller = new ChatController(connection, store, newChatSettings, turnTools);
const panel = new CachePanel({ figures: $("cache-figures"), error: $("cache-error"), chart: $("chart") }, authHeaders);
const view = {
  attachments: [], // read attachments waiting to be sent: see media.readAttachment
  editingId: null, // the user message being edited, if any
  rendered: new Map(), // message id -> its <article>; committed messages never change, so they are reused
  streamingEl: null, // the <article> of the reply being generated
  frame: 0, // requestAnimationFrame handle of a pending streaming render
  tokenRefused: false, // the server answered 401: it needs an access token (or a different one)
  chats: new Map(), // model id -> whether it chats (GET /v1/models' "chat": false for a base model)
};
window.turncache = { controller, connection, store }; // for debugging and the UI's tests

// ---------------------------------------------------------------- settings

/** /v1/ws, with the access token as the `token` query parameter (browsers cannot set headers on a WebSocket). */
function socketUrl() {
  const token = store.token();
  return token ? `${defaultUrl()}?token=${encodeURIComponent(token)}` : defaultUrl();
}

function authHeaders() {
  const token = store.token();
  return token ? { Authorization: `Bearer ${token}` } : {};
}

function onTokenChange() {
  const token = $("token").value.trim();
  if (token !== store.token()) {
    store.setToken(token);
    controller.switchAccount(); // sessions belong to the token's tenant
  }
  connection.url = socketUrl();
  if (connection.isOpen) connection.drop();
  else connection.connect();
  loadModels();
  panel.refresh();
}

function readField(name) {
  const spec = SAMPLING_FIELDS[name];
  const raw = $(name).value.trim();
  if (raw === "" && "empty" in spec) return { value: spec.empty };
  const value = spec.parse(raw);
  if (raw !== "" && !Number.isNaN(value) && spec.ok(value)) return { value };
  return { error: `${labelOf(name)} must be ${spec.rule}.` };
}

function labelOf(name) {
  return document.querySelector(`label[for="${name}"]`).textContent;
}

function samplingFromForm() {
  const sampling = {};
  for (const name of Object.keys(SAMPLING_FIELDS)) {
    const { value, error } = readField(name);
    if (!error) sampling[name] = value;
  }
  return sampling;
}

function newChatSettings() {
  return { model: ui.model.value || null, system: ui.system.value.trim() ? ui.system.value : null,
    sampling: samplingFromForm() };
}

/** The tools each turn offers, from the settings ({} when none; the JSON is checked when a message is sent). */
function turnTools() {
  const { tools } = parseTools($("tools").value);
  return tools ? { tools, tool_choice: $("tool_choice").value } : {};
}

function saveSettings() {
  store.saveSettings({ model: ui.model.value, system: ui.system.value, sampling: samplingFromForm(),
    tools: $("tools").value, toolChoice: $("tool_choice").value });
}

function showSettings({ model, system, sampling, tools, toolChoice }) {
  if (typeof tools === "string") $("tools").value = tools;
  if (["auto", "required", "none"].includes(toolChoice)) $("tool_choice").value = toolChoice;
  if (model) {
    if (![...ui.model.options].some((o) => o.value === model)) ui.model.append(new Option(model, model));
    ui.model.value = model;
  }
  if (system !== undefined) ui.system.value = system ?? "";
  for (const name of Object.keys(SAMPLING_FIELDS)) {
    if (sampling && name in sampling) $(name).value = sampling[name] ?? "";
    $(name).removeAttribute("aria-invalid");
  }
  ui.settingsError.hidden = true;
}

function onSamplingChange(event) {
  const name = event.target.name;
  if (!(name in SAMPLING_FIELDS)) return;
  const { value, error } = readField(name);
  if (error) event.target.setAttribute("aria-invalid", "true");
  else event.target.removeAttribute("aria-invalid");
  ui.settingsError.hidden = !error;
  ui.settingsError.textContent = error || "";
  if (error) return;
  saveSettings();
  controller.updateSettings({ sampling: { [name]: value } });
}

async function loadModels() {
  let ids = [];
  try {
    const res = await fetch("/v1/models", { cache: "no-store", headers: authHeaders() });
    view.tokenRefused = res.status === 401;
    if (view.tokenRefused) $("token").closest("details").open = true;
    showStatus(connection.state);
    if (!res.ok) throw new Error(`HTTP ${res.status}`);
    const body = await res.json();
    const listed = (body.data || []).filter((m) => typeof m.id === "string");
    ids = listed.map((m) => m.id);
    view.chats = new Map(listed.map((m) => [m.id, m.chat !== false]));
  } catch {
    // the list stays as it is; session.create without a model gets the server's default
  }
  const inSession = controller.session?.model;
  if (inSession && !ids.includes(inSession)) ids.push(inSession);
  if (!ids.length) return;
  const saved = store.settings().model;
  ui.model.replaceChildren(...[...new Set(ids)].map((id) => new Option(id, id)));
  ui.model.value = inSession ?? (ids.includes(saved) ? saved : ids[0]);
  renderChatAbility();
}

// A base model (no chat template) serves completions, not chat: say so and keep the composer closed, rather
// than let the first message fail.
function chats() {
  return view.chats.get(ui.model.value) !== false;
}

function renderChatAbility() {
  const able = chats();
  ui.noChat.hidden = able;
  ui.noChat.textContent = able
    ? ""
    : `${ui.model.value} is a base model: it has no chat template, so it cannot chat. It serves completions ` +
      "(POST /v1/completions). To chat with it, start the server with --chat-template FILE.";
  ui.message.disabled = !able;
  ui.attach.disabled = !able;
  ui.message.placeholder = able ? MESSAGE_PLACEHOLDER : "This model does not chat: it has no chat template";
  renderComposerState();
}

// ---------------------------------------------------------------- messages

const messageActions = { edit: startEdit, regenerate: () => controller.regenerate(), copy: copyText };

function renderAll() {
  const items = controller.displayMessages();
  const nearBottom = isNearBottom();
  const busy = controller.generating || controller.loading || !connection.isOpen;
  const lastReply = controller.generating ? -1 : items.map((m) => m.role).lastIndexOf("assistant");
  const keep = new Set();
  const nodes = items.map((item, i) => {
    if (item.streaming) {
      view.streamingEl ||= streamingArticle();
      fillStreaming(view.streamingEl, controller.turn);
      return view.streamingEl;
    }
    const key = item.id ?? `pending-${i}-${item.role}`;
    keep.add(key);
    if (key === view.editingId && !controller.generating) {
      return editorArticle(item, { submit: (content) => submitEdit(item.id, content), cancel: stopEditing });
    }
    let el = view.rendered.get(key);
    if (!el) {
      el = messageArticle(item, messageActions);
      view.rendered.set(key, el);
    }
    updateActions(el, { busy, hasId: Boolean(item.id), isLastReply: i === lastReply });
    return el;
  });
  if (!controller.generating) view.streamingEl = null;
  for (const key of view.rendered.keys()) if (!keep.has(key)) view.rendered.delete(key);
  const calls = controller.pendingCalls();
  if (calls.length) nodes.push(toolResultsForm(calls, { submit: (results) => controller.sendToolResults(results) }));
  ui.messages.replaceChildren(...nodes);
  ui.empty.hidden = items.length > 0 || controller.loading;
  ui.transcript.setAttribute("aria-busy", String(controller.loading));
  renderComposerState();
  renderSessions();
  panel.showSeries(controller.series());
  if (nearBottom) scrollToBottom();
}

function onDelta() {
  if (view.frame) return;
  view.frame = requestAnimationFrame(() => {
    view.frame = 0;
    if (!view.streamingEl || !controller.turn) return;
    const nearBottom = isNearBottom();
    fillStreaming(view.streamingEl, controller.turn);
    if (nearBottom) scrollToBottom();
  });
}

function isNearBottom() {
  const t = ui.transcript;
  return t.scrollHeight - t.scrollTop - t.clientHeight < 120;
}

function scrollToBottom() {
  ui.transcript.scrollTop = ui.transcript.scrollHeight;
}

async function copyText(text) {
  try {
    await navigator.clipboard.writeText(text);
    flashStatus("Copied");
  } catch {
    flashStatus("Copying was refused by the browser");
  }
}

function startEdit(id) {
  if (controller.generating) return;
  view.editingId = id;
  renderAll();
  const area = ui.messages.querySelector(".editor textarea");
  area?.focus();
  area?.setSelectionRange(area.value.length, area.value.length);
}

function submitEdit(id, content) {
  if (!controller.edit(id, content)) return;
  hideNotice();
  stopEditing();
}

function stopEditing() {
  view.editingId = null;
  renderAll();
}

// ---------------------------------------------------------------- composer and attachments

function renderComposerState() {
  const generating = controller.generating;
  ui.send.hidden = generating;
  ui.stop.hidden = !generating;
  ui.stop.disabled = Boolean(controller.turn?.stopping);
  ui.send.disabled = controller.loading || !connection.isOpen || !chats();
}

async function addFiles(files) {
  for (const file of files) {
    const problem = checkFile(file, view.attachments, ui.message.value.length);
    if (problem) {
      showNotice(problem);
      continue;
    }
    try {
      view.attachments.push(await readAttachment(file));
    } catch (err) {
      showNotice(err.message);
    }
    renderAttachments();
  }
}

function renderAttachments() {
  const items = view.attachments.map((a, i) => {
    const li = document.createElement("li");
    li.className = `attachment attachment-${a.kind}`;
    li.append(mediaElement(a.kind, a.dataUrl, a.name));
    const name = document.createElement("span");
    name.className = "attachment-name";
    name.textContent = `${a.name} · ${formatBytes(a.size)}`;
    const remove = document.createElement("button");
    remove.type = "button";
    remove.className = "icon-button";
    remove.textContent = "×";
    remove.setAttribute("aria-label", `Remove ${a.name}`);
    remove.addEventListener("click", () => {
      view.attachments.splice(i, 1);
      renderAttachments();
    });
    li.append(name, remove);
    return li;
  });
  ui.attachments.replaceChildren(...items);
  ui.attachments.hidden = items.length === 0;
}

function submitMessage() {
  const text = ui.message.value;
  if (!chats() || controller.generating || (!text.trim() && !view.attachments.length)) return;
  if (text.length > MAX_TEXT_CHARS) {
    showNotice(`The message is too long (${formatNumber(text.length)} characters; the limit is ` +
      `${formatNumber(MAX_TEXT_CHARS)}).`);
    return;
  }
  const toolsError = parseTools($("tools").value).error;
  if (toolsError) {
    showNotice(toolsError);
    return;
  }
  const content = buildContent(text, view.attachments);
  const size = new Blob([JSON.stringify({ type: "turn.create", content })]).size;
  if (size > MAX_FRAME_BYTES) {
    showNotice(`The message with its attachments is ${formatBytes(size)}; the limit is ` +
      `${formatBytes(MAX_FRAME_BYTES)}. Remove an attachment.`);
    return;
  }
  if (!controller.send(content, text)) return;
  hideNotice();
  ui.message.value = "";
  view.attachments = [];
  renderAttachments();
  autosize();
}

function autosize() {
  ui.message.style.height = "auto";
  ui.message.style.height = `${Math.min(ui.message.scrollHeight, 200)}px`;
}

function wireComposer() {
  ui.fileInput.accept = ACCEPT;
  ui.composer.addEventListener("submit", (e) => {
    e.preventDefault();
    submitMessage();
  });
  ui.message.addEventListener("keydown", (e) => {
    if (e.key === "Enter" && !e.shiftKey && !e.isComposing) {
      e.preventDefault();
      submitMessage();
    }
  });
  ui.message.addEventListener("input", autosize);
  ui.message.addEventListener("paste", (e) => {
    const files = [...(e.clipboardData?.files || [])];
    if (!files.length) return;
    if (!e.clipboardData.getData("text")) e.preventDefault();
    addFiles(files);
  });
  ui.stop.addEventListener("click", () => controller.stop());
  ui.attach.addEventListener("click", () => ui.fileInput.click());
  ui.fileInput.addEventListener("change", () => {
    addFiles([...ui.fileInput.files]);
    ui.fileInput.value = "";
  });
  ui.messages.addEventListener("click", (e) => {
    const button = e.target.closest(".copy-code");
    if (button) copyText(button.closest(".code-block").querySelector("code").textContent);
  });
  wireDrop();
}

/** Files dropped on the conversation are attached; dropped anywhere else they are ignored (no navigation). */
function wireDrop() {
  let depth = 0; // dragenter / dragleave fire for every child crossed
  const hasFiles = (e) => [...(e.dataTransfer?.types || [])].includes("Files");
  ui.chat.addEventListener("dragenter", (e) => {
    if (!hasFiles(e)) return;
    e.preventDefault();
    depth += 1;
    ui.dropOverlay.hidden = false;
  });
  ui.chat.addEventListener("dragover", (e) => {
    if (hasFiles(e)) e.preventDefault();
  });
  ui.chat.addEventListener("dragleave", () => {
    depth = Math.max(0, depth - 1);
    if (!depth) ui.dropOverlay.hidden = true;
  });
  ui.chat.addEventListener("drop", (e) => {
    e.preventDefault();
    depth = 0;
    ui.dropOverlay.hidden = true;
    addFiles([...(e.dataTransfer?.files || [])]);
  });
  window.addEventListener("dragover", (e) => e.preventDefault());
  window.addEventListener("drop", (e) => e.preventDefault());
}

// ---------------------------------------------------------------- notices and status

function showNotice(text, level = "error") {
  ui.noticeText.textContent = text;
  ui.notice.dataset.level = level;
  ui.notice.hidden = false;
}

function hideNotice() {
  ui.notice.hidden = true;
}

let statusTimer = 0;
function flashStatus(text) {
  ui.status.textContent = text;
  clearTimeout(statusTimer);
  statusTimer = setTimeout(() => showStatus(connection.state), 1500);
}

function showStatus(state, retryInMs = null) {
  ui.status.dataset.state = state;
  const seconds = Math.max(1, Math.round((retryInMs ?? 0) / 1000));
  const text = {
    open: "Connected",
    connecting: "Connecting…",
    waiting: `Offline · retrying in ${seconds} s`,
    closed: "Disconnected",
  };
  // A refused WebSocket handshake shows up in the browser as a plain failure; GET /v1/models tells why.
  const refused = state !== "open" && view.tokenRefused;
  ui.status.textContent = refused ? "The server needs an access token: Settings › Connection" : text[state] ?? state;
}

// ---------------------------------------------------------------- sessions list

function renderSessions() {
  const current = controller.session?.id ?? null;
  const items = store.sessions().map((s) => {
    const li = document.createElement("li");
    const open = document.createElement("button");
    open.type = "button";
    open.className = "session";
    if (s.id === current) open.setAttribute("aria-current", "true");
    const title = document.createElement("span");
    title.className = "session-title";
    title.textContent = s.title || "Untitled chat";
    const meta = document.createElement("span");
    meta.className = "session-meta";
    meta.textContent = `${s.id.slice(-6)} · ${new Date(s.updated).toLocaleString()}`;
    open.append(title, meta);
    open.addEventListener("click", () => {
      view.editingId = null;
      controller.open(s.id);
      closeDrawers();
    });
    const remove = document.createElement("button");
    remove.type = "button";
    remove.className = "icon-button session-remove";
    remove.textContent = "×";
    remove.setAttribute("aria-label", `Remove “${s.title || "Untitled chat"}” from the list`);
    remove.addEventListener("click", () => controller.forget(s.id));
    li.append(open, remove);
    return li;
  });
  ui.sessionList.replaceChildren(...items);
  ui.noSessions.hidden = items.length > 0;
}

// ---------------------------------------------------------------- drawers (narrow screens)

function toggleDrawer(drawer, button) {
  const open = !drawer.classList.contains("open");
  closeDrawers();
  if (open) {
    drawer.classList.add("open");
    button.setAttribute("aria-expanded", "true");
    ui.scrim.hidden = false;
  }
}

function closeDrawers() {
  for (const [drawer, button] of [[ui.sidebar, ui.toggleSidebar], [ui.cachePanel, ui.toggleCache]]) {
    drawer.classList.remove("open");
    button.setAttribute("aria-expanded", "false");
  }
  ui.scrim.hidden = true;
}

// ---------------------------------------------------------------- start

function start() {
  showSettings(store.settings());
  $("token").value = store.token();
  $("token").addEventListener("change", onTokenChange);
  wireComposer();
  renderAttachments();
  ui.settings.addEventListener("change", onSamplingChange);
  ui.settings.addEventListener("submit", (e) => e.preventDefault());
  ui.system.addEventListener("change", () => {
    saveSettings();
    controller.updateSettings({ system: ui.system.value.trim() ? ui.system.value : null });
  });
  $("tools").addEventListener("change", saveSettings);
  $("tool_choice").addEventListener("change", saveSettings);
  ui.model.addEventListener("change", () => {
    renderChatAbility();
    saveSettings();
    if (controller.session?.model !== ui.model.value) controller.newChat();
  });
  ui.newChat.addEventListener("click", () => {
    view.editingId = null;
    controller.newChat();
    closeDrawers();
    ui.message.focus();
  });
  ui.noticeClose.addEventListener("click", hideNotice);
  ui.toggleSidebar.addEventListener("click", () => toggleDrawer(ui.sidebar, ui.toggleSidebar));
  ui.toggleCache.addEventListener("click", () => toggleDrawer(ui.cachePanel, ui.toggleCache));
  ui.scrim.addEventListener("click", closeDrawers);
  document.addEventListener("keydown", (e) => {
    if (e.key === "Escape") closeDrawers();
  });

  controller.addEventListener("change", renderAll);
  controller.addEventListener("delta", onDelta);
  controller.addEventListener("notice", (e) => showNotice(e.detail.text, e.detail.level));
  controller.addEventListener("restore", (e) => {
    if (!ui.message.value.trim()) {
      ui.message.value = e.detail.text;
      autosize();
    }
  });
  controller.addEventListener("session", (e) => {
    const s = e.detail;
    showSettings({ model: s.model, system: s.system ?? "", sampling: s.sampling });
    saveSettings();
  });
  controller.addEventListener("done", () => panel.refresh());
  connection.addEventListener("status", (e) => {
    showStatus(e.detail.state, e.detail.retryInMs);
    if (e.detail.state === "waiting" && connection.failures === 2) loadModels(); // is it the token?
    renderAll();
  });

  loadModels();
  connection.start();
  panel.refresh();
  setInterval(() => panel.refresh(), METRICS_EVERY_MS);
  document.addEventListener("visibilitychange", () => panel.refresh());
  renderAll();
  ui.message.focus();
}

start();
