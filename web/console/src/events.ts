// kilnd's events as the console follows them: GET /events as a WebSocket
// (kiln.events), authenticated as the page's other WebSockets are, by the
// kiln.token.TOKEN subprotocol (a browser's WebSocket sets no header, and
// a URL would keep the token in logs). One held by the page, and never one
// of the six HTTP connections a browser keeps per host, which a streamed
// fetch would take for as long as the page is open.

import type { wire } from "@sandkiln/sdk";

export type KilnEvent = wire["schemas"]["Event"];

/** What a feed tells the page, in the order it happens. */
export interface FeedHandlers {
  /**
   * Each event once, in the order of its seq. Those kilnd held when the
   * feed began come first, with live false: what happened before the
   * page read what it shows.
   */
  event(e: KilnEvent, live: boolean): void;
  /**
   * What the page shows is to be read again: the feed has caught up with
   * the events held when it began, or kilnd was restarted (a kilnd of
   * another epoch, whose events do not tell what happened while none
   * answered). Every event after this one is told live.
   */
  reread(): void;
  /** Connected, and following. */
  live(): void;
  /** The connection broke; it is opened again in retryMs, from the last event told. */
  down(why: string, retryMs: number): void;
}

/**
 * Follows kilnd's events from now on: first those kilnd holds
 * (follow=false, which kilnd ends with 1000), then each as it happens. A
 * connection that breaks is opened again from the seq of the last event
 * told (after=, with its epoch=), so that none is missed or told twice.
 * The feed owns its socket and its timer; close ends both.
 */
export class EventFeed {
  private readonly base: string;
  private readonly token: string;
  private readonly on: FeedHandlers;
  // The last event told: its seq and the epoch that numbered it.
  private seq = 0;
  private epoch = "";
  // Whether those held at the start have all been told.
  private caughtUp = false;
  private socket: WebSocket | undefined;
  private timer: ReturnType<typeof setTimeout> | undefined;
  private backoff = 250;
  private closed = false;

  constructor(base: string, token: string, on: FeedHandlers) {
    this.base = base.replace(/^http/, "ws");
    this.token = token;
    this.on = on;
    this.connect();
  }

  /** The seq of the last event told (0: none yet). */
  get last(): number {
    return this.seq;
  }

  close(): void {
    this.closed = true;
    clearTimeout(this.timer);
    this.socket?.close();
  }

  private connect(): void {
    const q = new URLSearchParams({ after: String(this.seq) });
    if (this.epoch) q.set("epoch", this.epoch);
    if (!this.caughtUp) q.set("follow", "false");
    const ws = new WebSocket(`${this.base}/events?${q}`, ["kiln.events", "kiln.token." + this.token]);
    this.socket = ws;
    ws.onopen = () => {
      this.backoff = 250;
      if (this.caughtUp) this.on.live();
    };
    ws.onmessage = (m) => {
      if (this.closed) return;
      const e = JSON.parse(String(m.data)) as KilnEvent;
      if (e.epoch !== this.epoch) {
        // kilnd asked with another epoch gives all it holds, numbered anew.
        const restarted = this.epoch !== "";
        this.epoch = e.epoch;
        this.seq = 0;
        if (restarted && this.caughtUp) this.on.reread();
      }
      if (e.seq <= this.seq) return;
      this.seq = e.seq;
      this.on.event(e, this.caughtUp);
    };
    ws.onclose = (ev) => {
      if (this.closed || this.socket !== ws) return;
      if (!this.caughtUp && ev.code === 1000) {
        this.caughtUp = true;
        this.on.reread();
        this.connect();
        return;
      }
      const wait = this.backoff;
      this.backoff = Math.min(2 * wait, 5000);
      this.on.down(ev.reason || `the connection closed (${ev.code})`, wait);
      this.timer = setTimeout(() => this.connect(), wait);
    };
  }
}
