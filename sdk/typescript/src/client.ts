// Client: a gateway's address and credentials, acquire, and `using`, the
// scope that acquires a lease, runs a routine under it and releases it.
import { hostname } from "node:os";
import type { components } from "./openapi.js";
import { FencegwError } from "./errors.js";
import { answerError, clientTime, send, type Gateway } from "./http.js";
import { Lease, begin } from "./lease.js";

type AcquireRequest = components["schemas"]["AcquireRequest"];
type LeaseJSON = components["schemas"]["Lease"];

/** Options of a Client. */
export interface ClientOptions {
  /** Labels the client's leases for humans (dashboard, rejections; at most 128 bytes). Default: "HOSTNAME/PID". */
  holder?: string;
  /** An API key from the gateway's --auth-file, sent as `Authorization: Bearer`. */
  apiKey?: string;
  /** Bound on a control call's answer beyond any waitMs (10 000). */
  timeoutMs?: number;
  /** The fetch to use (default: the global one). */
  fetch?: typeof fetch;
}

/** Options of one acquire. */
export interface AcquireOptions {
  /** The lease's duration, measured by the gateway (100 ms to 1 h); renewals ask for the same. */
  ttlMs: number;
  /**
   * How long the gateway may wait for a held resource to become free (at
   * most 60 000); 0 or absent answers at once. When it runs out: LeaseHeldError,
   * or UnavailableError (`fence_busy`) if writes under the previous token are
   * still in flight.
   */
  waitMs?: number;
  /** Overrides the client's holder for this lease. */
  holder?: string;
  /**
   * Subtracted from the TTL when the SDK decides, on its own clock, that the
   * lease has run out (default: ttlMs/10; 0: none).
   */
  safetyMarginMs?: number;
  /** Abandons the acquire (it rejects with the signal's reason). */
  signal?: AbortSignal;
}

/** Talks to one fencegw gateway. */
export class Client {
  readonly #gw: Gateway;
  readonly #holder: string;
  readonly #timeoutMs: number;

  /** A client of the gateway at baseUrl ("http://127.0.0.1:8080"). */
  constructor(baseUrl: string, options: ClientOptions = {}) {
    const u = new URL(baseUrl);
    if ((u.protocol !== "http:" && u.protocol !== "https:") || u.host === "") {
      throw new TypeError(`fencegw: gateway URL ${JSON.stringify(baseUrl)}: want http://HOST[:PORT] or https://...`);
    }
    const headers: Record<string, string> = {};
    if (options.apiKey) headers["Authorization"] = `Bearer ${options.apiKey}`;
    this.#gw = {
      base: `${u.origin}${u.pathname.replace(/\/+$/, "")}`,
      headers,
      fetch: options.fetch ?? globalThis.fetch.bind(globalThis),
    };
    this.#holder = options.holder ?? `${hostname() || "worker"}/${process.pid}`;
    this.#timeoutMs = options.timeoutMs ?? 10_000;
  }

  /**
   * Asks the gateway for resource and returns the lease, renewed in the
   * background until release() or its loss. Every lease must end with
   * release() or its loss: until then a timer renews it (and keeps Node
   * running).
   *
   * Rejects with LeaseHeldError (someone else holds it), UnavailableError
   * (503, or no answer), or a FencegwError with the gateway's code
   * (`invalid_request`, `unauthorized`, ...).
   */
  async acquire(resource: string, options: AcquireOptions): Promise<Lease> {
    const body: AcquireRequest = {
      resource,
      holder: options.holder ?? this.#holder,
      ttl_ms: Math.round(options.ttlMs),
    };
    const waitMs = options.waitMs ?? 0;
    if (waitMs > 0) body.wait_ms = Math.round(waitMs);
    // The lease's time counts from here: the gateway starts its own count
    // later, when the request arrives, so the SDK gives up first.
    const sent = performance.now();
    const a = await send(this.#gw, {
      op: "acquire",
      method: "POST",
      url: `${this.#gw.base}/v1/leases`,
      headers: new Headers({ ...this.#gw.headers, "Content-Type": "application/json", "Fencing-Client-Time": clientTime(0) }),
      body: JSON.stringify(body),
      timeoutMs: waitMs + this.#timeoutMs,
      signal: options.signal,
      readBody: true,
    });
    if (a.response.status !== 201) throw answerError("acquire", a);
    const lease = JSON.parse(a.text) as LeaseJSON;
    const marginMs = options.safetyMarginMs ?? options.ttlMs / 10;
    const l = new Lease({ gw: this.#gw, lease, ttlMs: body.ttl_ms, marginMs: Math.max(0, marginMs), sent });
    await l[begin](sent);
    return l;
  }

  /**
   * Acquires resource, runs routine(lease, signal) under it, and releases
   * the lease when the routine ends, whether it returns or throws. `signal`
   * (the lease's) fires when the lease is lost: pass it to your fetch calls
   * and check it in loops. Resolves to what the routine returns; rejects
   * with what it throws, or with acquire's error. A failed release is not
   * reported: the lease then expires after its TTL. A lease lost during the
   * routine is reported only through the signal and the routine's own
   * errors (a refused write rejects with StaleLeaseError).
   */
  async using<T>(
    resource: string,
    options: AcquireOptions,
    routine: (lease: Lease, signal: AbortSignal) => Promise<T> | T,
  ): Promise<T> {
    const lease = await this.acquire(resource, options);
    try {
      return await routine(lease, lease.signal);
    } finally {
      await lease.release().catch((err: unknown) => {
        if (!(err instanceof FencegwError)) throw err;
      });
    }
  }
}
