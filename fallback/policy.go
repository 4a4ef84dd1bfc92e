package fallback

import (
	"fmt"
	"os"
	"strings"
)

// Transport is what carries a connection's bytes.
type Transport string

const (
	RDMA Transport = "rdma" // an RDMA reliable connection (rdmanet's *Conn)
	TCP  Transport = "tcp"  // a TCP connection
)

// Policy says which transports a dial or a listener may use.
type Policy int

const (
	// Auto uses RDMA when it can and TCP otherwise (the default).
	Auto Policy = iota
	// RDMAOnly never uses TCP: a dial that cannot use RDMA fails with the
	// reason, and a listener serves RDMA alone (Mayastor's tcpFallback=false).
	RDMAOnly
	// TCPOnly never tries RDMA.
	TCPOnly
)

// EnvPolicy is the environment variable that overrides the policy of every
// dial and listen on a "tcp" network in the process: "auto", "rdma" or
// "tcp". Operators use it to switch a binary between transports without
// rebuilding it. Networks that name RDMA ("rdma", "rdma4", "rdma6") always
// mean RDMA only and ignore it.
const EnvPolicy = "RDMANET_TRANSPORT"

func (p Policy) String() string {
	switch p {
	case Auto:
		return "auto"
	case RDMAOnly:
		return "rdma"
	case TCPOnly:
		return "tcp"
	}
	return fmt.Sprintf("Policy(%d)", int(p))
}

// ParsePolicy parses "auto", "rdma" or "tcp" (case and surrounding blanks
// do not matter; "rdma-only" and "tcp-only" are accepted too).
func ParsePolicy(s string) (Policy, error) {
	switch strings.ToLower(strings.TrimSpace(s)) {
	case "auto", "":
		return Auto, nil
	case "rdma", "rdma-only", "rdmaonly":
		return RDMAOnly, nil
	case "tcp", "tcp-only", "tcponly":
		return TCPOnly, nil
	}
	return Auto, &PolicyError{Value: s}
}

// PolicyError is a policy that cannot be parsed, from code or from
// EnvPolicy. A dial or listen with a malformed EnvPolicy fails with it
// rather than guess what the operator meant.
type PolicyError struct {
	Value  string
	Source string // "" or the environment variable it came from
}

func (e *PolicyError) Error() string {
	if e.Source != "" {
		return fmt.Sprintf("fallback: %s=%q is not a transport policy (want auto, rdma or tcp)", e.Source, e.Value)
	}
	return fmt.Sprintf("fallback: %q is not a transport policy (want auto, rdma or tcp)", e.Value)
}

// Effective is the policy a dial or listen on a "tcp" network uses: the
// value of EnvPolicy when it is set and not empty, else p.
func Effective(p Policy) (Policy, error) {
	v, ok := os.LookupEnv(EnvPolicy)
	if !ok || strings.TrimSpace(v) == "" {
		return p, nil
	}
	q, err := ParsePolicy(v)
	if err != nil {
		return p, &PolicyError{Value: v, Source: EnvPolicy}
	}
	return q, nil
}
