// @fencegw/client: the fencegw SDK for Node workers (see README.md).
export { Client, type ClientOptions, type AcquireOptions } from "./client.js";
export { Lease, newIdempotencyKey, replayed, type RequestOptions, type RequestBody } from "./lease.js";
export {
  FencegwError,
  LeaseLostError,
  StaleLeaseError,
  LeaseHeldError,
  UnavailableError,
  UpstreamError,
  OutcomeUnknownError,
  Codes,
  type Problem,
  type Op,
} from "./errors.js";
export type { components, paths } from "./openapi.js";
