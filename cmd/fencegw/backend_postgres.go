package main

import (
	"context"
	"errors"
	"log/slog"
)

func openPostgres(ctx context.Context, cfg config, log *slog.Logger) (*backend, error) {
	return nil, errors.New("PostgreSQL mode is not wired yet")
}
