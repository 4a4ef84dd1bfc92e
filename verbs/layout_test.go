package verbs

import (
	"reflect"
	"testing"

	"github.com/rdmanet/sdk/internal/rdmacore"
)

// flatLayout lists the offset and size of every leaf field of t.
func flatLayout(t reflect.Type, base uintptr) [][2]uintptr {
	var out [][2]uintptr
	for i := 0; i < t.NumField(); i++ {
		f := t.Field(i)
		if f.Type.Kind() == reflect.Struct {
			out = append(out, flatLayout(f.Type, base+f.Offset)...)
			continue
		}
		out = append(out, [2]uintptr{base + f.Offset, f.Type.Size()})
	}
	return out
}

// TestLayoutsMatchRDMACore: PostSend, PostRecv and Poll hand the caller's slices
// to C as rdmacore's types, so every field must sit where rdmacore's does.
func TestLayoutsMatchRDMACore(t *testing.T) {
	pairs := []struct{ public, core any }{
		{SendWR{}, rdmacore.SendReq{}},
		{RecvWR{}, rdmacore.RecvReq{}},
		{WorkCompletion{}, rdmacore.WC{}},
	}
	for _, p := range pairs {
		pt, ct := reflect.TypeOf(p.public), reflect.TypeOf(p.core)
		if pt.Size() != ct.Size() {
			t.Errorf("%v is %d bytes, %v is %d", pt, pt.Size(), ct, ct.Size())
		}
		if a, b := flatLayout(pt, 0), flatLayout(ct, 0); !reflect.DeepEqual(a, b) {
			t.Errorf("%v fields (offset,size) %v differ from %v %v", pt, a, ct, b)
		}
	}
}
