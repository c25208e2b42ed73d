// Package api holds fencegw's OpenAPI spec (openapi.yaml) and the Go code
// oapi-codegen generates from it: the types of its schemas and parameters
// and the client (this package, which imports only net/http and the
// oapi-codegen runtime: the SDK in client/ builds on it), and the chi
// strict-server interface (package api/server, for the gateway). Nothing
// here is written by hand but the spec, the generator configurations and
// this file.
package api

import _ "embed" // Spec

// Spec is api/openapi.yaml, byte for byte. The gateway serves it at
// /v1/openapi.yaml (and as JSON at /v1/openapi.json). A binary that does
// not refer to Spec does not carry it: the linker drops unreferenced data.
//
//go:embed openapi.yaml
var Spec []byte

//go:generate go tool oapi-codegen -config types.cfg.yaml openapi.yaml
//go:generate go tool oapi-codegen -config client.cfg.yaml openapi.yaml
//go:generate go tool oapi-codegen -config server/server.cfg.yaml openapi.yaml
