// DOM builders for the transcript: a committed message, the reply being streamed, and the editor of an earlier
// user message. User text is shown with textContent, replies with renderMarkdown; media only from data: URLs.

import { renderMarkdown } from "./markdown.js";
import { mediaElement, splitContent } from "./media.js";
import { reasoningBox, splitThinking } from "./reasoning.js";
import { badgeText } from "./stats.js";
import { toolCallCard, toolResultCard } from "./tools.js";

/**
 * The <article> of a committed message. `item` = {id, role, content, finish_reason, tool_calls, stats}; a reply's
 * tool calls are cards after its text, a `tool` message a result card;
 * `on` = {edit(id), regenerate(), copy(text)}.
 */
export function messageArticle(item, on) {
  const el = document.createElement("article");
  el.className = `msg msg-${item.role}`;
  if (item.id) el.dataset.id = item.id;
  if (item.role === "tool") {
    el.setAttribute("aria-label", "Tool result");
    el.append(toolResultCard(item));
    return el;
  }
  el.setAttribute("aria-label", item.role === "user" ? "Your message" : "Reply");
  const { text, media } = splitContent(item.content);
  if (media.length) el.append(mediaBox(media));
  const body = document.createElement("div");
  if (item.role === "user") {
    body.className = "msg-body plain";
    body.textContent = text;
  } else {
    body.className = "msg-body markdown";
    replyBody(body, text);
  }
  if (text || (item.role === "assistant" && !item.tool_calls?.length)) el.append(body);
  for (const call of item.tool_calls ?? []) el.append(toolCallCard(call));
  if (item.role === "assistant") {
    const badge = replyBadge(item);
    if (badge) el.append(badge);
  }
  const actions = document.createElement("div");
  actions.className = "msg-actions";
  if (item.role === "user") {
    actions.append(actionButton("Edit", "Edit this message", () => on.edit(item.id), "edit"));
  } else {
    actions.append(actionButton("Copy", "Copy this reply", () => on.copy(splitThinking(text).answer), "copy"));
    actions.append(actionButton("Regenerate", "Regenerate this reply", () => on.regenerate(), "regenerate"));
  }
  el.append(actions);
  return el;
}

/** Enable or hide a message's buttons: Regenerate only on the last reply, nothing while a turn runs. */
export function updateActions(el, { busy, hasId, isLastReply }) {
  const edit = el.querySelector(".action-edit");
  if (edit) edit.disabled = busy || !hasId;
  const regen = el.querySelector(".action-regenerate");
  if (regen) {
    regen.hidden = !isLastReply;
    regen.disabled = busy;
  }
}

/** The <article> that shows the reply being generated; fill it with fillStreaming. */
export function streamingArticle() {
  const el = document.createElement("article");
  el.className = "msg msg-assistant streaming";
  el.setAttribute("aria-label", "Reply being written");
  el.setAttribute("aria-busy", "true");
  const body = document.createElement("div");
  body.className = "msg-body markdown";
  el.append(body);
  return el;
}

/** Show the reply so far (`turn.text`), or a typing mark before the first token. */
export function fillStreaming(el, turn) {
  const body = el.querySelector(".msg-body");
  if (turn.text) {
    replyBody(body, turn.text);
    return;
  }
  const dots = document.createElement("span");
  dots.className = "typing";
  dots.textContent = turn.stopping ? "stopping…" : "…";
  body.replaceChildren(dots);
}

/**
 * A form that edits the user message `item`: its media is kept, its text replaced.
 * `on` = {submit(content) -> boolean (sent), cancel()}.
 */
export function editorArticle(item, on) {
  const { text, media } = splitContent(item.content);
  const form = document.createElement("form");
  form.className = "msg msg-user editor";
  form.setAttribute("aria-label", "Edit message");
  if (media.length) form.append(mediaBox(media));
  const label = document.createElement("label");
  label.className = "visually-hidden";
  label.textContent = "Edited message";
  const area = document.createElement("textarea");
  area.value = text;
  area.rows = Math.min(10, Math.max(2, text.split("\n").length));
  label.htmlFor = area.id = "edit-message";
  const hint = document.createElement("p");
  hint.className = "hint";
  hint.textContent = "Sending replaces this message and everything after it.";
  const row = document.createElement("div");
  row.className = "editor-actions";
  const cancel = document.createElement("button");
  cancel.type = "button";
  cancel.textContent = "Cancel";
  const save = document.createElement("button");
  save.type = "submit";
  save.className = "primary";
  save.textContent = "Send edit";
  row.append(cancel, save);
  form.append(label, area, hint, row);
  cancel.addEventListener("click", () => on.cancel());
  form.addEventListener("submit", (e) => {
    e.preventDefault();
    const parts = media.map((m) => m.part);
    if (!area.value.trim() && !parts.length) return;
    if (area.value.trim()) parts.push({ type: "text", text: area.value });
    on.submit(media.length ? parts : area.value);
  });
  area.addEventListener("keydown", (e) => {
    if (e.key === "Escape") on.cancel();
    if (e.key === "Enter" && !e.shiftKey && !e.isComposing) {
      e.preventDefault();
      form.requestSubmit();
    }
  });
  return form;
}

// ---------------------------------------------------------------- internals

/** A reply's text in `body`: its thinking folded (if any), then its answer as Markdown. */
function replyBody(body, text) {
  const { reasoning, answer, thinking } = splitThinking(text);
  const parts = reasoning === null ? [] : [reasoningBox(reasoning, thinking)];
  body.replaceChildren(...parts, renderMarkdown(answer));
}

function mediaBox(media) {
  const box = document.createElement("div");
  box.className = "msg-media";
  media.forEach((m) => box.append(mediaElement(m.kind, m.src, `${m.kind} attachment`)));
  return box;
}

function replyBadge(item) {
  const badge = document.createElement("p");
  badge.className = "badge";
  if (item.stats) {
    badge.textContent = badgeText(item.stats);
    badge.dataset.cachedTokens = String(item.stats.k);
    badge.dataset.promptTokens = String(item.stats.p);
  } else if (item.finish_reason === "cancelled" || item.finish_reason === "length") {
    badge.textContent = item.finish_reason === "cancelled" ? "stopped" : "cut at max tokens";
  }
  return badge.textContent ? badge : null;
}

function actionButton(text, label, onClick, role) {
  const b = document.createElement("button");
  b.type = "button";
  b.className = `action action-${role}`;
  b.textContent = text;
  b.setAttribute("aria-label", label);
  b.addEventListener("click", onClick);
  return b;
}
