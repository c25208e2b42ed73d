// Lease: one grant of a resource, renewed in the background on the
// monotonic clock, with an AbortSignal that fires when it is lost, and the
// fenced requests sent under it through the gateway's proxy.
import { randomBytes } from "node:crypto";
import type { components } from "./openapi.js";
import {
  Codes,
  FencegwError,
  LeaseLostError,
  StaleLeaseError,
  UnavailableError,
  UpstreamError,
  errorFor,
  isProblem,
  parseProblem,
  retryAfterMs,
} from "./errors.js";
import { answerError, clientTime, maxProblemBody, send, type Gateway } from "./http.js";

type LeaseJSON = components["schemas"]["Lease"];

/** @internal the method that starts a new lease's timers (not exported from the package). */
export const begin = Symbol("begin");

/** How long release() waits for the gateway. A lease that could not be released expires after its TTL. */
export const releaseTimeoutMs = 5_000;

/** The default bound on one fenced request's answer: longer than the gateway's own forward timeout (30 s), so that its 504 comes first. */
export const requestTimeoutMs = 35_000;

/** A fenced request's body: anything fetch can send again on a retry (no streams). */
export type RequestBody = string | Uint8Array | ArrayBuffer | URLSearchParams | Blob | null;

/** Options of Lease.request. */
export interface RequestOptions {
  body?: RequestBody;
  headers?: HeadersInit;
  /**
   * Send the write with this Idempotency-Key and retry it with the same key
   * while its outcome is unknown (no answer, a cut connection, 502/503/504,
   * `idempotency_key_in_progress`): the gateway applies a key at most once
   * and answers a retry from its record of the first attempt (the answer
   * then has `Idempotent-Replayed: true`). One key per logical write; see
   * newIdempotencyKey. Without a key the request is sent once.
   */
  idempotencyKey?: string;
  /** Tries with an idempotencyKey, the first included (5). */
  attempts?: number;
  /** No answer within this long: UnavailableError (35 000). */
  timeoutMs?: number;
}

/** A fresh random Idempotency-Key (128 bits, hex): one per logical write, reused for each of its retries. */
export function newIdempotencyKey(): string {
  return randomBytes(16).toString("hex");
}

/** Whether an answer was served from the gateway's record of an earlier attempt with the same key (the write was applied once, by that attempt). */
export function replayed(response: Response): boolean {
  return response.headers.get("idempotent-replayed") === "true";
}

/** @internal what Client passes to a new Lease. */
export interface LeaseInit {
  gw: Gateway;
  lease: LeaseJSON;
  ttlMs: number;
  marginMs: number;
  /** performance.now() when the acquire was sent. */
  sent: number;
}

/**
 * One grant of a resource, kept alive in the background: renewed every
 * TTL/3, a failed renewal retried with backoff, and lost when the gateway
 * answers `lease_lost`, when a fenced write under it is refused as stale,
 * or when its TTL (minus a safety margin) runs out on the monotonic clock
 * since the last successful renewal was sent. On loss, `signal` fires with
 * a LeaseLostError as its reason.
 *
 * Holding a Lease does not mean the lease is held: the process can stall
 * past the TTL between any check and the next write. What keeps data safe
 * is the gateway's fence: a write sent with `request` is refused
 * (StaleLeaseError) unless this is the resource's current lease when the
 * gateway admits it.
 */
export class Lease {
  /** The lease's secret id, sent as Fencing-Lease: never log it. */
  readonly id: string;
  /** The fencing token: larger than any granted before for the resource. */
  readonly token: number;
  readonly resource: string;
  readonly holder: string;
  /** The TTL asked for at acquire and at each renewal. */
  readonly ttlMs: number;

  readonly #gw: Gateway;
  readonly #marginMs: number;
  readonly #lost = new AbortController();
  /** Aborted when renewing stops (release or loss): ends an in-flight renewal. */
  readonly #stop = new AbortController();
  #deadline: number;
  #expiry: ReturnType<typeof setTimeout> | undefined;
  #renewal: ReturnType<typeof setTimeout> | undefined;
  #backoffMs = 0;
  #rttMs: number;
  #lastError: unknown;
  #released = false;
  /** The gateway's word that the lease is lost: release then fails with it. */
  #final: LeaseLostError | undefined;
  #releasing: Promise<void> | undefined;

  /** @internal use Client.acquire. */
  constructor(init: LeaseInit) {
    this.#gw = init.gw;
    this.id = init.lease.lease_id;
    this.token = init.lease.token;
    this.resource = init.lease.resource;
    this.holder = init.lease.holder;
    this.ttlMs = init.ttlMs;
    this.#marginMs = init.marginMs;
    this.#rttMs = performance.now() - init.sent;
    this.#deadline = init.sent + init.lease.ttl_ms - init.marginMs;
  }

  /**
   * @internal Client.acquire calls it once, before handing the lease out:
   * starts the expiry timer and the renewals. If the acquire took longer
   * than a renewal period (it waited for the resource), the lease is
   * renewed first: the gateway's count began at the grant, somewhere within
   * the call, but only the call's send time is a safe local bound for it,
   * and a lease counted from there could be lost on arrival. Rejects with
   * the LeaseLostError if the gateway says the lease is gone.
   */
  async [begin](sent: number): Promise<void> {
    let last = sent;
    if (performance.now() - sent > this.#every()) {
      const s = performance.now();
      try {
        await this.#renew(s, this.ttlMs);
        last = s;
      } catch (err) {
        if (err instanceof LeaseLostError) {
          this.#lose(err, true);
          throw err;
        }
        this.#lastError = err;
      }
    }
    this.#armExpiry();
    this.#scheduleRenewal(last + this.#every());
  }

  /**
   * Fires when the lease is lost, with a LeaseLostError (or StaleLeaseError)
   * as `reason`. Pass it to your own fetch calls and loops; the lease's own
   * requests use it already. Release does not fire it.
   */
  get signal(): AbortSignal {
    return this.#lost.signal;
  }

  /**
   * Whether the lease is known to be lost, checking the deadline now (a
   * stalled event loop may not yet have run the timer that fires `signal`).
   */
  get lost(): boolean {
    this.#expire(false);
    return this.#lost.signal.aborted;
  }

  /** Why the lease is lost; undefined while it is not known to be. */
  get error(): LeaseLostError | undefined {
    return this.lost ? (this.#lost.signal.reason as LeaseLostError) : undefined;
  }

  /** Throws the LeaseLostError if the lease is known to be lost (see `lost`). */
  check(): void {
    const e = this.error;
    if (e) throw e;
  }

  /**
   * When the lease runs out on the local clock unless renewed before, as a
   * performance.now() value: the last successful renewal's send time plus
   * the TTL the gateway reported, minus the safety margin.
   */
  get deadline(): number {
    return this.#deadline;
  }

  /**
   * Sends a request to `upstream` through the gateway as a fenced write
   * under this lease: `POST /stock/SKU-001` to upstream `inventory` goes to
   * `{gateway}/v1/proxy/inventory/stock/SKU-001`, and on to the upstream's
   * `/stock/SKU-001` only if this lease is the resource's current one.
   * `path` is passed through as given, query and percent-encoding included
   * (encode a resource name in a path yourself: `inventory%2FSKU-001`).
   *
   * Resolves to the upstream's Response whatever its status (an upstream's
   * own 409 is an answer, not an error). Rejects with StaleLeaseError (the
   * write was refused, never reached the upstream, and the lease is now
   * lost), UnavailableError (503, or no answer: whether the write was
   * forwarded is then unknown), UpstreamError (502/504), LeaseLostError if
   * the lease was lost while the request awaited its answer (it is aborted; its
   * outcome is unknown), or a FencegwError with the gateway's code.
   *
   * A request made after the lease is known to be lost is still sent: the
   * gateway decides, and records the refusal where operators see it.
   */
  async request(method: string, upstream: string, path: string, options: RequestOptions = {}): Promise<Response> {
    const url = `${this.#gw.base}/v1/proxy/${encodeURIComponent(upstream)}${path.startsWith("/") ? "" : "/"}${path}`;
    const headers = new Headers(options.headers);
    for (const [k, v] of Object.entries(this.#gw.headers)) headers.set(k, v);
    headers.set("Fencing-Lease", this.id);
    const timeoutMs = options.timeoutMs ?? requestTimeoutMs;
    const key = options.idempotencyKey;
    if (key === undefined) return this.#write(method, url, headers, options.body, timeoutMs);

    headers.set("Idempotency-Key", `"${key.replace(/[\\"]/g, "\\$&")}"`);
    const attempts = Math.max(1, options.attempts ?? 5);
    let pauseMs = 100;
    for (let attempt = 1; ; attempt++) {
      try {
        return await this.#write(method, url, headers, options.body, timeoutMs);
      } catch (err) {
        if (attempt >= attempts || !this.#retryable(err)) throw err;
        const wait = err instanceof FencegwError && err.retryAfterMs > 0 ? err.retryAfterMs : pauseMs;
        pauseMs = Math.min(2 * pauseMs, 2_000);
        await new Promise((resolve) => setTimeout(resolve, wait));
      }
    }
  }

  /** A write's outcome is still open: a retry with the same key learns it from the gateway's record. */
  #retryable(err: unknown): boolean {
    if (err instanceof LeaseLostError || !(err instanceof FencegwError)) return false;
    return (
      (err instanceof UnavailableError && (err.status === 503 || err.status === 0)) ||
      err instanceof UpstreamError ||
      err.code === Codes.keyInProgress
    );
  }

  async #write(method: string, url: string, headers: Headers, body: RequestBody | undefined, timeoutMs: number): Promise<Response> {
    // A lease already lost is not aborted: the write goes to the gateway,
    // which refuses and records it.
    const lostBefore = this.lost;
    let response: Response;
    try {
      ({ response } = await send(this.#gw, {
        op: "write",
        method,
        url,
        headers,
        body: (body ?? null) as BodyInit | null,
        timeoutMs,
        signal: lostBefore ? undefined : this.#lost.signal,
      }));
    } catch (err) {
      if (err instanceof LeaseLostError && err === this.#lost.signal.reason) {
        throw new LeaseLostError(`fencegw: write: aborted because the lease was lost; whether it reached the upstream is unknown: ${err.message}`, {
          op: "write",
          code: err.code,
          status: err.status,
          problem: err.problem,
          cause: err,
        });
      }
      throw err;
    }
    if (response.status < 400 || !isProblem(response.headers)) return response;
    const text = await response.clone().text();
    const problem = text.length <= maxProblemBody ? parseProblem(text) : undefined;
    if (problem === undefined) return response; // the upstream's own problem: an answer
    await response.body?.cancel();
    const err = errorFor("write", response.status, problem, retryAfterMs(response.headers));
    if (err instanceof StaleLeaseError) this.#lose(err, true);
    throw err;
  }

  /**
   * Stops renewing and releases the lease at the gateway, so the resource
   * is free at once. Resolves if the gateway released it (now or by an
   * earlier call). Rejects with the LeaseLostError if the lease had been
   * lost (work done under it may have been refused), or UnavailableError if
   * the gateway did not answer: the lease then expires after its TTL, and
   * release may be called again. Does not fire `signal`.
   */
  release(): Promise<void> {
    this.#stopRenewing();
    this.#releasing ??= this.#release().finally(() => {
      this.#releasing = undefined;
    });
    return this.#releasing;
  }

  async #release(): Promise<void> {
    if (this.#released) return;
    if (this.#final) throw this.#final;
    const a = await send(this.#gw, {
      op: "release",
      method: "DELETE",
      url: `${this.#gw.base}/v1/leases/${encodeURIComponent(this.id)}`,
      headers: new Headers(this.#gw.headers),
      timeoutMs: releaseTimeoutMs,
      readBody: true,
    });
    if (a.response.status === 204) {
      this.#released = true;
      clearTimeout(this.#expiry);
      return;
    }
    const err = answerError("release", a);
    if (err instanceof LeaseLostError) this.#lose(err, true);
    throw err;
  }

  #every(): number {
    return Math.max(this.ttlMs / 3, 1);
  }

  /**
   * Renews at due, a performance.now() value. Node's timers may fire a
   * little early (they count from a millisecond clock read at the start of
   * the event loop's turn), and a renewal sent early moves every later one
   * earlier with it: the cadence is the monotonic clock's, so a timer that
   * fires before due waits out the rest, as the expiry timer does.
   */
  #scheduleRenewal(due: number): void {
    if (this.#stop.signal.aborted) return;
    this.#renewal = setTimeout(() => {
      if (performance.now() < due) this.#scheduleRenewal(due);
      else void this.#renewOnce();
    }, Math.max(0, due - performance.now()));
  }

  async #renewOnce(): Promise<void> {
    const sent = performance.now();
    try {
      await this.#renew(sent);
      this.#backoffMs = 0;
      this.#lastError = undefined;
      this.#scheduleRenewal(sent + this.#every());
    } catch (err) {
      if (this.#stop.signal.aborted) return;
      if (err instanceof LeaseLostError) {
        this.#lose(err, true); // the gateway's word: expired, released or superseded
        return;
      }
      this.#lastError = err;
      this.#backoffMs = nextBackoff(this.#backoffMs, this.ttlMs);
      this.#scheduleRenewal(performance.now() + this.#backoffMs);
    }
  }

  /**
   * One renewal, bounded by the local deadline (after it the lease counts as
   * lost whatever the answer) or by boundMs; a success moves the deadline to its send
   * time plus the TTL the gateway reported, minus the margin.
   */
  async #renew(sent: number, boundMs?: number): Promise<void> {
    const left = boundMs ?? this.#deadline - sent;
    if (left <= 0) throw new Error("the deadline passed before the renewal was sent");
    const a = await send(this.#gw, {
      op: "renew",
      method: "POST",
      url: `${this.#gw.base}/v1/leases/${encodeURIComponent(this.id)}/renew`,
      headers: new Headers({
        ...this.#gw.headers,
        "Content-Type": "application/json",
        "Fencing-Client-Time": clientTime(this.#rttMs),
      }),
      body: JSON.stringify({ ttl_ms: this.ttlMs }),
      timeoutMs: left,
      signal: this.#stop.signal,
      readBody: true,
    });
    this.#rttMs = performance.now() - sent;
    if (a.response.status !== 200) throw answerError("renew", a);
    const lease = JSON.parse(a.text) as LeaseJSON;
    if (this.#lost.signal.aborted) return; // lost meanwhile; it stays lost
    const d = sent + lease.ttl_ms - this.#marginMs;
    if (d > this.#deadline) {
      this.#deadline = d;
      this.#armExpiry();
    }
  }

  #armExpiry(): void {
    clearTimeout(this.#expiry);
    this.#expiry = setTimeout(() => this.#expire(true), Math.max(0, this.#deadline - performance.now()));
  }

  /** Unless released, or renewed meanwhile, the lease is lost once its deadline has passed. */
  #expire(fromTimer: boolean): void {
    if (this.#released || this.#lost.signal.aborted) return;
    if (performance.now() < this.#deadline) {
      if (fromTimer) this.#armExpiry(); // fired early, or the deadline moved
      return;
    }
    const last = this.#lastError instanceof Error ? `; last renewal: ${this.#lastError.message}` : "";
    this.#lose(
      new LeaseLostError(
        `fencegw: lease lost: the TTL ran out without a successful renewal (resource ${JSON.stringify(this.resource)}, token ${this.token})${last}`,
        { op: "renew", cause: this.#lastError },
      ),
      false,
    );
  }

  /** Marks the lease lost (the first cause wins), fires the signal and stops renewing. */
  #lose(err: LeaseLostError, final: boolean): void {
    if (final && this.#final === undefined && !this.#released) this.#final = err;
    if (this.#lost.signal.aborted) return;
    this.#stopRenewing();
    clearTimeout(this.#expiry);
    this.#lost.abort(err);
  }

  #stopRenewing(): void {
    clearTimeout(this.#renewal);
    this.#stop.abort();
  }
}

/** Doubles from TTL/20 up to TTL/6, with ±20 % jitter so that workers that lost the gateway together do not retry in step. */
function nextBackoff(prevMs: number, ttlMs: number): number {
  const lo = Math.max(ttlMs / 20, 5);
  const hi = Math.max(ttlMs / 6, 5);
  const d = Math.min(Math.max(2 * prevMs, lo), hi);
  return d + (Math.random() * 0.4 - 0.2) * d;
}
