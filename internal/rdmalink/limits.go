package rdmalink

import (
	"fmt"
	"sync"

	"github.com/rdmanet/sdk/verbs"
)

// LimitError: a device cannot give a connection what it needs. Limit is
// the device attribute (ibv_device_attr's field name), Have the device's
// value, Need what the connection's Config asks for.
type LimitError struct {
	Device string
	Limit  string
	Have   int
	Need   int
}

func (e *LimitError) Error() string {
	return fmt.Sprintf("rdmanet: device %s allows %s %d, the connection needs %d (use a smaller rdmanet.Config)",
		e.Device, e.Limit, e.Have, e.Need)
}

// deviceAttrs caches each device's limits: they are fixed while it exists,
// and querying them is a system call per connection otherwise.
var deviceAttrs sync.Map // device name -> verbs.DeviceAttr

// checkLimits checks what a connection relies on against the device's
// limits, before anything is allocated: a queue pair with sendWRs and
// recvWRs requests of one scatter-gather entry each, and a completion queue
// of cqSize entries. Devices differ (siw allows 32768 requests a queue,
// rxe more), and an error that names the limit beats an EINVAL from
// ibv_create_qp.
func checkLimits(ctx *verbs.Context, sendWRs, recvWRs, cqSize int) (verbs.DeviceAttr, error) {
	var attr verbs.DeviceAttr
	if v, ok := deviceAttrs.Load(ctx.Name()); ok {
		attr = v.(verbs.DeviceAttr)
	} else {
		var err error
		if attr, err = ctx.QueryDevice(); err != nil {
			return attr, err
		}
		deviceAttrs.Store(ctx.Name(), attr)
	}
	for _, c := range []struct {
		limit      string
		have, need int
	}{
		{"max_qp_wr", attr.MaxQPWR, max(sendWRs, recvWRs)},
		{"max_cqe", attr.MaxCQE, cqSize},
		{"max_sge", attr.MaxSGE, 1},
	} {
		if c.have < c.need {
			return attr, &LimitError{Device: ctx.Name(), Limit: c.limit, Have: c.have, Need: c.need}
		}
	}
	return attr, nil
}
