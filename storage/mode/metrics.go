package mode

// The PostgreSQL fence's metrics, part of Mode.Collectors.

import (
	"sync/atomic"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/fencegw/fencegw/storage/postgres"
)

// fenceMetrics exports what the replica's fence does (storage/postgres/fence.go).
func fenceMetrics(f *postgres.Fence) []prometheus.Collector {
	st := f.Stats()
	counter := func(name, help string, v *atomic.Int64) prometheus.Collector {
		return prometheus.NewCounterFunc(prometheus.CounterOpts{Name: name, Help: help}, func() float64 { return float64(v.Load()) })
	}
	return []prometheus.Collector{
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "fencegw_fences_held",
			Help: "Resources whose shared fence this replica holds in PostgreSQL (one advisory lock each)."},
			func() float64 { return float64(f.Held()) }),
		counter("fencegw_fence_local_admits_total", "Writes admitted on the replica's own fence, without a database round trip.", &st.LocalAdmits),
		counter("fencegw_fence_acquired_total", "Shared fences taken (one round trip each).", &st.Acquired),
		counter("fencegw_fence_yielded_total", "Shared fences given up (idle, ended, or another replica's grant, release or revoke).", &st.Yielded),
		counter("fencegw_fence_lost_total", "Fences dropped because their lock session died: their resources drain before the next grant.", &st.Lost),
	}
}
