// The WebSocket to /v1/ws: JSON events in and out, client event ids, keep-alive pings, and reconnection with
// backoff. It knows nothing about sessions; the chat controller resumes its session on every "open".
//
// Events dispatched (all CustomEvent):
//   "open"      the socket is (re)connected; detail = {reconnect: boolean}
//   "message"   one server event; detail = the parsed JSON object
//   "status"    the connection state changed; detail = {state, retryInMs}
//               state: "connecting" | "open" | "waiting" (a retry is scheduled) | "closed" (stopped for good)

const BACKOFF_MS = [250, 500, 1000, 2000, 4000, 8000]; // delay before retry n (the last one repeats)
const PING_EVERY_MS = 20000; // keep-alive interval while open
const PONG_WITHIN_MS = 10000; // a socket that does not answer a ping within this is treated as dropped

/** The default endpoint: /v1/ws on the page's own host. */
export function defaultUrl(loc = window.location) {
  return `${loc.protocol === "https:" ? "wss" : "ws"}://${loc.host}/v1/ws`;
}

export class Connection extends EventTarget {
  constructor(url, { WebSocketImpl = WebSocket, backoffMs = BACKOFF_MS, random = Math.random } = {}) {
    super();
    this.url = url; // the endpoint; may be changed, the next connect uses it
    this.WebSocketImpl = WebSocketImpl; // injectable for tests
    this.backoffMs = backoffMs; // retry delays
    this.random = random; // jitter source
    this.socket = null; // the current WebSocket, if any
    this.state = "connecting"; // see the module comment
    this.failures = 0; // consecutive failed attempts, picks the backoff delay
    this.connectedOnce = false; // the next "open" is a reconnect
    this.nextId = 1; // client event ids: "c1", "c2", ...
    this.stopped = false; // close() was called: no more retries
    this.retryTimer = null; // pending reconnect
    this.pingTimer = null; // keep-alive interval
    this.pongTimer = null; // drops the socket when a ping goes unanswered
  }

  get isOpen() {
    return this.state === "open";
  }

  /** Open the socket. Call once; reconnection is automatic until close(). */
  start() {
    this.connect();
  }

  /** Send a client event; its event_id is assigned here and returned. Returns null while not connected. */
  send(event) {
    if (!this.isOpen) return null;
    const eventId = event.event_id ?? `c${this.nextId++}`;
    this.socket.send(JSON.stringify({ ...event, event_id: eventId }));
    return eventId;
  }

  /** Stop for good. */
  close() {
    this.stopped = true;
    clearTimeout(this.retryTimer);
    this.stopPing();
    this.socket?.close(1000);
    this.setState("closed");
  }

  /** Drop the current socket as if the network failed (it reconnects). Used by the UI's tests. */
  drop() {
    this.socket?.close(4000, "dropped by client");
  }

  // ---------------------------------------------------------------- internals

  connect() {
    clearTimeout(this.retryTimer);
    const old = this.socket;
    this.socket = null; // its handlers now ignore it
    old?.close(1000);
    this.stopPing();
    this.setState("connecting");
    let socket;
    try {
      socket = new this.WebSocketImpl(this.url);
    } catch {
      this.scheduleRetry();
      return;
    }
    this.socket = socket;
    socket.onopen = () => {
      if (socket !== this.socket) return;
      this.failures = 0;
      this.setState("open");
      this.startPing();
      const reconnect = this.connectedOnce;
      this.connectedOnce = true;
      this.dispatchEvent(new CustomEvent("open", { detail: { reconnect } }));
    };
    socket.onmessage = (msg) => {
      if (socket !== this.socket || typeof msg.data !== "string") return;
      let event;
      try {
        event = JSON.parse(msg.data);
      } catch {
        return; // the server only sends JSON; ignore anything else
      }
      if (event && event.type === "pong") clearTimeout(this.pongTimer);
      this.dispatchEvent(new CustomEvent("message", { detail: event }));
    };
    socket.onclose = () => {
      if (socket !== this.socket) return;
      this.socket = null;
      this.stopPing();
      if (!this.stopped) this.scheduleRetry();
    };
    socket.onerror = () => {}; // onclose follows and handles it
  }

  scheduleRetry() {
    const base = this.backoffMs[Math.min(this.failures, this.backoffMs.length - 1)];
    const delay = Math.round(base * (0.8 + 0.4 * this.random()));
    this.failures += 1;
    this.setState("waiting", delay);
    this.retryTimer = setTimeout(() => this.connect(), delay);
  }

  startPing() {
    this.stopPing();
    this.pingTimer = setInterval(() => {
      if (!this.send({ type: "ping" })) return;
      clearTimeout(this.pongTimer);
      this.pongTimer = setTimeout(() => this.drop(), PONG_WITHIN_MS);
    }, PING_EVERY_MS);
  }

  stopPing() {
    clearInterval(this.pingTimer);
    clearTimeout(this.pongTimer);
  }

  setState(state, retryInMs = null) {
    this.state = state;
    this.dispatchEvent(new CustomEvent("status", { detail: { state, retryInMs } }));
  }
}
