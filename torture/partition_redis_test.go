package torture

import (
	"context"
	"errors"
	"strings"
	"testing"
)

// The partition-redis fault puts a replica in the network namespace, is
// refused outside the redis mode before anything is made, and is not
// applicable without a namespace; other faults pass it by.
func TestPartitionRedisFault(t *testing.T) {
	cfg := Config{Mode: ModePostgres, Replicas: 2, Faults: []string{FaultPartitionRedis}}
	if !cfg.needsPartition() {
		t.Error("partition-redis does not put a replica in a namespace")
	}
	_, err := partitionReplica(context.Background(), &cfg, &Replica{}, nil, nil)
	if err == nil || !strings.Contains(err.Error(), "redis mode") {
		t.Errorf("partition-redis in the postgres mode: %v, want refused", err)
	}
	n := &nemesis{cfg: Config{Mode: ModeRedis}, replicas: []*Replica{{}}}
	if ok, err := n.injectPartitionRedis(context.Background(), &Fault{Kind: FaultPartitionRedis}); !ok || !errors.Is(err, errNotApplicable) {
		t.Errorf("without a namespace: %v %v, want not applicable", ok, err)
	}
	if ok, _ := n.injectPartitionRedis(context.Background(), &Fault{Kind: FaultPartition}); ok {
		t.Error("partition-redis took the partition fault")
	}
}
