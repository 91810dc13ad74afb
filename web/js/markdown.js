// A small Markdown renderer that builds DOM nodes and never parses HTML.
//
// Model output is untrusted: every character of it reaches the page through createTextNode / textContent, so
// "<script>" or "<img onerror=...>" shows up as text. Links are made only for http:, https: and mailto: URLs;
// images are never loaded (they become links). Unclosed constructs (a code fence still streaming) render as if
// closed at the end of the text.
//
// Blocks: paragraphs (single newlines are line breaks), ATX headings, fenced code (``` or ~~~), block quotes,
// bullet and numbered lists (nested by indentation), pipe tables, horizontal rules.
// Inline: `code`, **strong**, *em* / _em_, ~~strike~~, [links](url), <autolinks>, bare http(s) URLs, \escapes.

const FENCE = /^ {0,3}(`{3,}|~{3,})\s*([^`\s]*)/;
const HEADING = /^ {0,3}(#{1,6})(?:[ \t]+(.*?))?(?:[ \t]+#+)?[ \t]*$/;
const RULE = /^ {0,3}([-*_])(?:[ \t]*\1){2,}[ \t]*$/;
const QUOTE = /^ {0,3}> ?/;
const ITEM = /^( {0,12})([-*+]|\d{1,9}[.)])([ \t]+|$)/;
const TABLE_SEP = /^ {0,3}\|?[ \t]*:?-+:?[ \t]*(\|[ \t]*:?-+:?[ \t]*)*\|?[ \t]*$/;
const SAFE_PROTOCOLS = new Set(["http:", "https:", "mailto:"]);
const MAX_DEPTH = 8; // nesting of quotes / lists rendered as structure; deeper input renders as text

/** The DocumentFragment showing `text` as Markdown. */
export function renderMarkdown(text, doc = document) {
  const out = doc.createDocumentFragment();
  renderBlocks(String(text ?? "").replace(/\r\n?/g, "\n").split("\n"), out, doc, 0);
  return out;
}

/** `href` if it is an absolute http(s) or mailto URL, else null. */
export function safeHref(href) {
  try {
    const url = new URL(href);
    return SAFE_PROTOCOLS.has(url.protocol) ? url.href : null;
  } catch {
    return null;
  }
}

// ---------------------------------------------------------------- blocks

function renderBlocks(lines, parent, doc, depth) {
  let i = 0;
  while (i < lines.length) {
    const line = lines[i];
    if (!line.trim()) {
      i += 1;
      continue;
    }
    const step = depth < MAX_DEPTH ? blockAt(lines, i, parent, doc, depth) : 0;
    i += step || paragraph(lines, i, parent, doc);
  }
}

// Render the block starting at lines[i] if it is not a paragraph; return how many lines it used (0: a paragraph).
function blockAt(lines, i, parent, doc, depth) {
  const line = lines[i];
  if (FENCE.test(line)) return codeBlock(lines, i, parent, doc);
  const heading = HEADING.exec(line);
  if (heading) {
    const h = doc.createElement(`h${Math.min(heading[1].length + 2, 6)}`);
    renderInline(heading[2] || "", h, doc);
    parent.append(h);
    return 1;
  }
  if (RULE.test(line)) {
    parent.append(doc.createElement("hr"));
    return 1;
  }
  if (QUOTE.test(line)) {
    let j = i;
    const inner = [];
    while (j < lines.length && lines[j].trim() && (QUOTE.test(lines[j]) || inner.length)) {
      inner.push(lines[j].replace(QUOTE, ""));
      j += 1;
    }
    const quote = doc.createElement("blockquote");
    renderBlocks(inner, quote, doc, depth + 1);
    parent.append(quote);
    return j - i;
  }
  if (ITEM.test(line)) return list(lines, i, parent, doc, depth);
  if (line.includes("|") && i + 1 < lines.length && TABLE_SEP.test(lines[i + 1]) && lines[i + 1].includes("-")) {
    return table(lines, i, parent, doc);
  }
  return 0;
}

function startsBlock(line) {
  return FENCE.test(line) || HEADING.test(line) || RULE.test(line) || QUOTE.test(line) || ITEM.test(line);
}

function paragraph(lines, i, parent, doc) {
  let j = i;
  const text = [];
  while (j < lines.length && lines[j].trim() && (j === i || !startsBlock(lines[j]))) {
    text.push(lines[j].trim());
    j += 1;
  }
  const p = doc.createElement("p");
  text.forEach((t, k) => {
    if (k) p.append(doc.createElement("br"));
    renderInline(t, p, doc);
  });
  parent.append(p);
  return j - i;
}

function codeBlock(lines, i, parent, doc) {
  const [, fence, lang] = FENCE.exec(lines[i]);
  const indent = lines[i].length - lines[i].trimStart().length;
  const close = new RegExp(`^ {0,3}${fence[0] === "`" ? "`" : "~"}{${fence.length},}[ \\t]*$`);
  let j = i + 1;
  const body = [];
  while (j < lines.length && !close.test(lines[j])) {
    body.push(lines[j].replace(new RegExp(`^ {0,${indent}}`), ""));
    j += 1;
  }
  const box = doc.createElement("div");
  box.className = "code-block";
  const bar = doc.createElement("div");
  bar.className = "code-bar";
  const label = doc.createElement("span");
  label.textContent = lang || "code";
  const copy = doc.createElement("button");
  copy.type = "button";
  copy.className = "copy-code";
  copy.textContent = "Copy";
  copy.setAttribute("aria-label", `Copy ${lang || "code"} to clipboard`);
  bar.append(label, copy);
  const pre = doc.createElement("pre");
  const code = doc.createElement("code");
  if (/^[\w+#.-]{1,32}$/.test(lang)) code.className = `language-${lang}`;
  code.textContent = body.join("\n");
  pre.append(code);
  box.append(bar, pre);
  parent.append(box);
  return Math.min(j + 1, lines.length) - i;
}

function list(lines, i, parent, doc, depth) {
  const first = ITEM.exec(lines[i]);
  const indent = first[1].length;
  const ordered = /\d/.test(first[2]);
  const el = doc.createElement(ordered ? "ol" : "ul");
  if (ordered && parseInt(first[2], 10) !== 1) el.start = parseInt(first[2], 10);
  let j = i;
  while (j < lines.length) {
    const m = ITEM.exec(lines[j]);
    if (!m || m[1].length !== indent || /\d/.test(m[2]) !== ordered) break;
    const contentIndent = m[0].length;
    const body = [lines[j].slice(contentIndent)];
    j += 1;
    while (j < lines.length) {
      const line = lines[j];
      const lead = line.length - line.trimStart().length;
      if (!line.trim()) {
        const next = lines.slice(j + 1).find((l) => l.trim());
        const nextLead = next === undefined ? 0 : next.length - next.trimStart().length;
        if (next === undefined || nextLead <= indent) break;
        body.push("");
      } else if (lead > indent) {
        body.push(line.slice(Math.min(lead, contentIndent)));
      } else if (ITEM.test(line) || startsBlock(line) || !body[body.length - 1].trim()) {
        break;
      } else {
        body.push(line.trim()); // a lazy continuation of the item's paragraph
      }
      j += 1;
    }
    const li = doc.createElement("li");
    const tight = !body.some((l) => !l.trim());
    if (tight && !body.slice(1).some(startsBlock)) {
      body.forEach((t, k) => {
        if (k) li.append(doc.createElement("br"));
        renderInline(t.trim(), li, doc);
      });
    } else {
      renderBlocks(body, li, doc, depth + 1);
    }
    el.append(li);
    while (j < lines.length && !lines[j].trim()) {
      const next = lines.slice(j).find((l) => l.trim());
      const m2 = next && ITEM.exec(next);
      if (!m2 || m2[1].length !== indent) break;
      j += 1;
    }
  }
  parent.append(el);
  return j - i;
}

function splitRow(line) {
  let row = line.trim();
  if (row.startsWith("|")) row = row.slice(1);
  if (row.endsWith("|") && !row.endsWith("\\|")) row = row.slice(0, -1);
  const cells = [];
  let cell = "";
  for (let k = 0; k < row.length; k += 1) {
    if (row[k] === "\\" && row[k + 1] === "|") {
      cell += "|";
      k += 1;
    } else if (row[k] === "|") {
      cells.push(cell.trim());
      cell = "";
    } else {
      cell += row[k];
    }
  }
  cells.push(cell.trim());
  return cells;
}

function table(lines, i, parent, doc) {
  const head = splitRow(lines[i]);
  const aligns = splitRow(lines[i + 1]).map((c) =>
    c.startsWith(":") && c.endsWith(":") ? "center" : c.endsWith(":") ? "right" : c.startsWith(":") ? "left" : "",
  );
  const wrap = doc.createElement("div");
  wrap.className = "table-wrap";
  const t = doc.createElement("table");
  const row = (cells, tag) => {
    const tr = doc.createElement("tr");
    head.forEach((_, k) => {
      const td = doc.createElement(tag);
      if (aligns[k]) td.className = `align-${aligns[k]}`;
      renderInline(cells[k] ?? "", td, doc);
      tr.append(td);
    });
    return tr;
  };
  const thead = doc.createElement("thead");
  thead.append(row(head, "th"));
  const tbody = doc.createElement("tbody");
  let j = i + 2;
  while (j < lines.length && lines[j].trim() && lines[j].includes("|")) {
    tbody.append(row(splitRow(lines[j]), "td"));
    j += 1;
  }
  t.append(thead, tbody);
  wrap.append(t);
  parent.append(wrap);
  return j - i;
}

// ---------------------------------------------------------------- inline

const BARE_URL = /^https?:\/\/[^\s<>"'`]+/;
const ESCAPABLE = /[\\`*_{}[\]()#+\-.!|~<>"']/;

/** Append the inline Markdown `text` to `parent` as DOM nodes. */
export function renderInline(text, parent, doc = document, depth = 0) {
  let plain = "";
  const flush = () => {
    if (plain) parent.append(doc.createTextNode(plain));
    plain = "";
  };
  let i = 0;
  while (i < text.length) {
    const c = text[i];
    const rest = text.slice(i);
    if (c === "\\" && ESCAPABLE.test(text[i + 1] || "")) {
      plain += text[i + 1];
      i += 2;
      continue;
    }
    const made = depth < MAX_DEPTH ? inlineAt(text, i, rest, doc, depth) : null;
    if (made) {
      flush();
      parent.append(made.node);
      i += made.length;
      continue;
    }
    plain += c;
    i += 1;
  }
  flush();
}

// The inline element starting at text[i], as {node, length}, or null.
function inlineAt(text, i, rest, doc, depth) {
  const c = text[i];
  if (c === "`") {
    const run = /^`+/.exec(rest)[0];
    const end = rest.indexOf(run, run.length);
    if (end < 0) return null;
    const code = doc.createElement("code");
    code.textContent = rest.slice(run.length, end).replace(/^ (.+) $/, "$1");
    return { node: code, length: end + run.length };
  }
  if (c === "*" || c === "_" || c === "~") return emphasis(text, i, rest, doc, depth);
  if (c === "[" || (c === "!" && text[i + 1] === "[")) return link(rest, doc, depth);
  if (c === "<") {
    const m = /^<((?:https?:\/\/|mailto:)[^\s<>]+)>/.exec(rest);
    if (m && safeHref(m[1])) return { node: anchor(m[1], m[1], doc), length: m[0].length };
    return null;
  }
  if ((c === "h" || c === "H") && (i === 0 || /[\s(]/.test(text[i - 1]))) {
    const m = BARE_URL.exec(rest);
    if (!m) return null;
    const url = m[0].replace(/[.,;:!?)\]]+$/, "");
    return safeHref(url) ? { node: anchor(url, url, doc), length: url.length } : null;
  }
  return null;
}

function emphasis(text, i, rest, doc, depth) {
  const c = text[i];
  const double = rest[1] === c;
  if (c === "~" && !double) return null;
  const mark = double ? c + c : c;
  const after = rest[mark.length];
  if (!after || /\s/.test(after)) return null;
  if (c === "_" && i > 0 && /[\p{L}\p{N}]/u.test(text[i - 1])) return null; // snake_case stays text
  let from = mark.length + 1;
  while (from <= rest.length) {
    const end = rest.indexOf(mark, from);
    if (end < 0) return null;
    const before = rest[end - 1];
    const next = rest[end + mark.length];
    const closes = !/\s/.test(before) && !(c === "_" && next && /[\p{L}\p{N}]/u.test(next));
    if (closes && !(mark.length === 1 && next === c)) {
      const tag = c === "~" ? "del" : double ? "strong" : "em";
      const node = doc.createElement(tag);
      renderInline(rest.slice(mark.length, end), node, doc, depth + 1);
      return { node, length: end + mark.length };
    }
    from = end + (mark.length === 1 && next === c ? 2 : 1);
  }
  return null;
}

function link(rest, doc, depth) {
  const image = rest[0] === "!";
  const start = image ? 1 : 0;
  let level = 0;
  let close = -1;
  for (let k = start; k < rest.length; k += 1) {
    if (rest[k] === "\\") k += 1;
    else if (rest[k] === "[") level += 1;
    else if (rest[k] === "]" && --level === 0) {
      close = k;
      break;
    }
  }
  if (close < 0 || rest[close + 1] !== "(") return null;
  const m = /^\(\s*<?([^\s()<>]*(?:\([^\s()<>]*\)[^\s()<>]*)*)>?(?:\s+"[^"]*")?\s*\)/.exec(rest.slice(close + 1));
  if (!m) return null;
  const label = rest.slice(start + 1, close);
  const href = safeHref(m[1]);
  const length = close + 1 + m[0].length;
  if (!href) {
    const span = doc.createElement("span");
    renderInline(label, span, doc, depth + 1);
    return { node: span, length };
  }
  const a = anchor(href, null, doc);
  if (image) {
    a.textContent = label ? `[image: ${label}]` : "[image]";
  } else {
    renderInline(label, a, doc, depth + 1);
  }
  return { node: a, length };
}

function anchor(href, text, doc) {
  const a = doc.createElement("a");
  a.href = safeHref(href);
  a.target = "_blank";
  a.rel = "noopener noreferrer nofollow";
  if (text !== null) a.textContent = text;
  return a;
}
