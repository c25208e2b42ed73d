package gateway

import (
	"net/http"
	"reflect"
	"strconv"
	"testing"
)

// reset leaves a pooled directState as new, however its fields' storage
// was used: a few fields, one taken out (Authorization), and a head that
// grew past the storage onto the heap. A field left behind would keep a
// client's values alive in the pool.
func TestDirectStateResetClearsAll(t *testing.T) {
	for _, n := range []int{0, 3, 8, 23, 24, 30} {
		st := new(directState)
		st.h = st.fields[:0]
		h := &st.h
		for i := range n {
			h.Add("X-F"+strconv.Itoa(i), []string{"v"})
		}
		h.Set("Authorization", []string{"Bearer k"})
		h.Add(HeaderToken, []string{"1"})
		h.Del("Authorization")
		st.out = http.Request{Method: "POST", Host: "up"}
		st.vals[0], st.hooks.http10, st.open.err = "1.2.3.4", true, http.ErrBodyNotAllowed
		st.small[0], st.small[len(st.small)-1] = 'b', 'c'
		st.reset()
		// The small body's buffer keeps its bytes (written before it is
		// read); everything else is zero.
		st.small = [len(st.small)]byte{}
		if !reflect.ValueOf(*st).IsZero() {
			for i, f := range st.fields {
				if f.Name != "" || f.Values != nil {
					t.Errorf("%d fields: fields[%d] = %+v after reset", n, i, f)
				}
			}
			t.Fatalf("%d fields: the state is not zero after reset", n)
		}
	}
}
