package main

// OpenTelemetry tracing, on when the standard OTEL_* variables ask for it.

import (
	"context"
	"fmt"
	"strings"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"
)

// tracingSetting is what the standard OTEL_* variables ask of tracing:
// off unless an OTLP endpoint or OTEL_TRACES_EXPORTER=otlp is set, and off
// whatever else is set with OTEL_SDK_DISABLED=true or
// OTEL_TRACES_EXPORTER=none. Only OTLP over HTTP/protobuf is built in; any
// other exporter or protocol is refused at start rather than ignored.
func tracingSetting(getenv func(string) string) (on bool, err error) {
	if strings.EqualFold(strings.TrimSpace(getenv("OTEL_SDK_DISABLED")), "true") {
		return false, nil
	}
	switch exp := strings.TrimSpace(getenv("OTEL_TRACES_EXPORTER")); exp {
	case "none":
		return false, nil
	case "otlp":
		on = true
	case "":
		on = getenv("OTEL_EXPORTER_OTLP_ENDPOINT") != "" || getenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") != ""
	default:
		return false, usageError("OTEL_TRACES_EXPORTER=%s is not supported (otlp or none)", exp)
	}
	if !on {
		return false, nil
	}
	for _, name := range []string{"OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "OTEL_EXPORTER_OTLP_PROTOCOL"} {
		if p := strings.TrimSpace(getenv(name)); p != "" {
			if p != "http/protobuf" {
				return false, usageError("%s=%s is not supported (http/protobuf)", name, p)
			}
			break // the traces-specific one wins
		}
	}
	return true, nil
}

// startTracing builds the TracerProvider the OTEL_* variables ask for, once
// tracingSetting said they do (the exporter's endpoint, headers and
// timeout, the sampler, the batch processor and the resource attributes
// are the SDK's own readings of the process environment). shutdown flushes the spans not yet
// exported, within its context.
func startTracing(ctx context.Context) (tp trace.TracerProvider, shutdown func(context.Context) error, err error) {
	exp, err := otlptracehttp.New(ctx)
	if err != nil {
		return nil, nil, fmt.Errorf("OpenTelemetry exporter: %w", err)
	}
	// service.name defaults to fencegw; OTEL_SERVICE_NAME and
	// OTEL_RESOURCE_ATTRIBUTES (read by WithFromEnv, later) override it.
	res, err := resource.New(ctx, resource.WithAttributes(attribute.String("service.name", "fencegw")),
		resource.WithFromEnv(), resource.WithTelemetrySDK())
	if err != nil {
		return nil, nil, fmt.Errorf("OpenTelemetry resource: %w", err)
	}
	sdk := sdktrace.NewTracerProvider(sdktrace.WithBatcher(exp), sdktrace.WithResource(res))
	return sdk, func(ctx context.Context) error {
		ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		return sdk.Shutdown(ctx)
	}, nil
}
