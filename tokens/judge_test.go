package tokens

import (
	"errors"
	"testing"
	"time"
)

// The fence rule has one implementation (Resource.StateOf); Judge refuses
// by it. Each case pins the state and the refusal, including the
// precedence: superseded over released over expired.
func TestJudgeFollowsStateOf(t *testing.T) {
	t0 := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	lease := Lease{ID: "fl_a", Resource: "r", Holder: "A", Token: 2, ExpiresAt: t0.Add(time.Second)}
	released := lease
	released.ReleasedAt = t0.Add(-time.Millisecond)
	renewed := lease
	renewed.ExpiresAt = t0.Add(time.Minute)
	next := Lease{ID: "fl_b", Resource: "r", Holder: "B", Token: 3, ExpiresAt: t0.Add(time.Minute)}

	cases := []struct {
		name  string
		r     Resource
		now   time.Time
		state LeaseState
		kind  error // nil: admitted
		// expires is the expiry the refusal reports (the current one if
		// lease is still its resource's current lease).
		expires time.Time
	}{
		{"current", Resource{Token: 2, Lease: &lease}, t0, StateCurrent, nil, time.Time{}},
		{"expired at its expiry", Resource{Token: 2, Lease: &lease}, lease.ExpiresAt, StateExpired, ErrLeaseExpired, lease.ExpiresAt},
		{"released", Resource{Token: 2, Lease: &released}, t0, StateReleased, ErrLeaseReleased, lease.ExpiresAt},
		{"released wins over expired", Resource{Token: 2, Lease: &released}, t0.Add(time.Hour), StateReleased, ErrLeaseReleased, lease.ExpiresAt},
		{"renewed since it was read", Resource{Token: 2, Lease: &renewed}, t0.Add(2 * time.Second), StateCurrent, nil, time.Time{}},
		{"renewed, then expired", Resource{Token: 2, Lease: &renewed}, t0.Add(time.Hour), StateExpired, ErrLeaseExpired, renewed.ExpiresAt},
		{"superseded", Resource{Token: 3, Lease: &next}, t0, StateSuperseded, ErrStaleToken, lease.ExpiresAt},
		{"superseded wins over expired", Resource{Token: 3, Lease: &next}, t0.Add(time.Hour), StateSuperseded, ErrStaleToken, lease.ExpiresAt},
		{"superseded wins over released", Resource{Token: 3, Lease: &released}, t0, StateSuperseded, ErrStaleToken, lease.ExpiresAt},
		{"no current lease", Resource{Token: 2}, t0, StateSuperseded, ErrStaleToken, lease.ExpiresAt},
		{"another lease current", Resource{Token: 2, Lease: &Lease{ID: "fl_x", Token: 2, ExpiresAt: t0.Add(time.Minute)}}, t0, StateSuperseded, ErrStaleToken, lease.ExpiresAt},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if got := tc.r.StateOf(lease, tc.now); got != tc.state {
				t.Errorf("StateOf = %q, want %q", got, tc.state)
			}
			err := Judge(lease, tc.r, tc.now)
			if tc.kind == nil {
				if err != nil {
					t.Fatalf("Judge = %v, want admitted", err)
				}
				return
			}
			if !errors.Is(err, tc.kind) {
				t.Fatalf("Judge = %v, want %v", err, tc.kind)
			}
			e := ErrorOf(err)
			if e.Resource != "r" || e.Token != 2 || e.CurrentToken != tc.r.Token || e.Holder != "A" || !e.ExpiresAt.Equal(tc.expires) {
				t.Errorf("facts %+v; want resource r, token 2, current %d, holder A, expires %v", e, tc.r.Token, tc.expires)
			}
		})
	}
}
