// Package api holds fencegw's OpenAPI spec and the code oapi-codegen
// generates from it. Nothing here is written by hand but the spec.
package api

//go:generate go tool oapi-codegen -config server.cfg.yaml openapi.yaml
//go:generate go tool oapi-codegen -config client.cfg.yaml openapi.yaml
