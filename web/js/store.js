// What survives a page reload, in localStorage: the list of past sessions (id, first words, model, time), the
// session that was open, the settings, and the per-reply figures (the conversation event does not carry them).
// Media is never stored here. Every read tolerates missing or corrupt values.
//
// Sessions belong to the tenant of the access token that created them (the server answers any other token as if
// they did not exist), so the list and the open session are kept per token: each entry carries `account`, a short
// tag of the token (accountTag), and only the current token's entries are listed. Entries from before tags existed
// are listed for every token until one of them is touched again.

const KEY_SESSIONS = "turncache.sessions"; // [{id, title, model, updated, account}], most recent first
const KEY_CURRENT = "turncache.current"; // id of the session that was open (+ "." + account tag with a token)
const KEY_SETTINGS = "turncache.settings"; // {model, system, sampling}
const KEY_STATS = "turncache.stats."; // + session id -> {message id: compact stats}
const KEY_TOKEN = "turncache.token"; // the server's access token, when it needs one
const MAX_SESSIONS = 50; // sessions listed; older ones are forgotten
const MAX_STATS = 300; // reply figures kept per session
const TITLE_WORDS = 8;

export class LocalStore {
  constructor(storage = window.localStorage) {
    this.storage = storage; // a Storage (localStorage), or a stand-in in tests
  }

  /** The sessions of the current access token (see the top of this file). */
  sessions() {
    const account = this.account();
    return this.allSessions().filter((s) => s.account === undefined || s.account === account);
  }

  allSessions() {
    const list = this.read(KEY_SESSIONS, []);
    return Array.isArray(list) ? list.filter((s) => s && typeof s.id === "string") : [];
  }

  /** Add or refresh a session of the current token in the list; `title` is only set the first time one is given. */
  touchSession(id, { title = null, model = null } = {}) {
    const list = this.allSessions();
    const old = list.find((s) => s.id === id);
    const entry = { id, title: old?.title || (title ? titleOf(title) : ""), model: model || old?.model || "",
      updated: Date.now(), account: this.account() };
    const rest = list.filter((s) => s.id !== id);
    for (const dropped of rest.slice(MAX_SESSIONS - 1)) this.storage.removeItem(KEY_STATS + dropped.id);
    this.write(KEY_SESSIONS, [entry, ...rest.slice(0, MAX_SESSIONS - 1)]);
  }

  /** Drop a session of the current token from the list (another token's entry with that id is kept). */
  forgetSession(id) {
    const account = this.account();
    const mine = (s) => s.id === id && (s.account === undefined || s.account === account);
    const list = this.allSessions();
    this.write(KEY_SESSIONS, list.filter((s) => !mine(s)));
    if (!list.some((s) => s.id === id && !mine(s))) this.storage.removeItem(KEY_STATS + id);
    if (this.current() === id) this.storage.removeItem(this.currentKey());
  }

  current() {
    return this.storage.getItem(this.currentKey());
  }

  setCurrent(id) {
    if (id) this.storage.setItem(this.currentKey(), id);
    else this.storage.removeItem(this.currentKey());
  }

  /** The tag of the current access token ("" without one). */
  account() {
    return accountTag(this.token());
  }

  currentKey() {
    const account = this.account();
    return account ? `${KEY_CURRENT}.${account}` : KEY_CURRENT;
  }

  settings() {
    const s = this.read(KEY_SETTINGS, {});
    return s && typeof s === "object" ? s : {};
  }

  saveSettings(settings) {
    this.write(KEY_SETTINGS, settings);
  }

  token() {
    return this.storage.getItem(KEY_TOKEN) || "";
  }

  setToken(token) {
    if (token) this.storage.setItem(KEY_TOKEN, token);
    else this.storage.removeItem(KEY_TOKEN);
  }

  stats(sessionId) {
    const s = this.read(KEY_STATS + sessionId, {});
    return s && typeof s === "object" ? s : {};
  }

  saveStats(sessionId, messageId, figures) {
    const all = this.stats(sessionId);
    all[messageId] = figures;
    const keys = Object.keys(all);
    for (const k of keys.slice(0, Math.max(0, keys.length - MAX_STATS))) delete all[k];
    this.write(KEY_STATS + sessionId, all);
  }

  read(key, fallback) {
    try {
      const raw = this.storage.getItem(key);
      return raw === null ? fallback : JSON.parse(raw);
    } catch {
      return fallback;
    }
  }

  write(key, value) {
    try {
      this.storage.setItem(key, JSON.stringify(value));
    } catch {
      // storage full or disabled: the list is a convenience, the chat goes on without it
    }
  }
}

/** A short tag of an access token, to tell tokens' sessions apart: FNV-1a (32 bits) in hex; "" for no token. It is
 * stored next to the token itself, so it reveals nothing the page does not already keep. */
export function accountTag(token) {
  if (!token) return "";
  let h = 0x811c9dc5;
  for (const ch of String(token)) {
    h ^= ch.codePointAt(0);
    h = Math.imul(h, 0x01000193) >>> 0;
  }
  return h.toString(16).padStart(8, "0");
}

/** The first words of a message, for the session list. */
export function titleOf(text) {
  const words = String(text).trim().split(/\s+/).filter(Boolean);
  const head = words.slice(0, TITLE_WORDS).join(" ");
  return words.length > TITLE_WORDS ? `${head}…` : head;
}
