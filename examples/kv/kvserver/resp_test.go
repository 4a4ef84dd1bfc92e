package kvserver

import (
	"bytes"
	"errors"
	"io"
	"strconv"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

var testLimits = limits{maxBulk: 1 << 10, maxArgs: 16, maxInline: 256, maxRequest: 4 << 10}

// readAll reads every request in input, and the error that ended them.
func readAll(input string, l limits, bufSize int) ([][]string, error) {
	rr := newRequestReader(strings.NewReader(input), bufSize, l)
	var reqs [][]string
	for {
		args, err := rr.ReadRequest()
		if err != nil {
			return reqs, err
		}
		req := []string{}
		for _, a := range args {
			req = append(req, string(a))
		}
		reqs = append(reqs, req)
	}
}

func TestReadRequest(t *testing.T) {
	long := strings.Repeat("x", 300)
	tests := []struct {
		name  string
		input string
		want  [][]string
		err   string // "" for io.EOF at the end; else the error's text
	}{
		{"multibulk", "*2\r\n$3\r\nGET\r\n$1\r\nk\r\n", [][]string{{"GET", "k"}}, ""},
		{"binary", "*2\r\n$4\r\nECHO\r\n$6\r\na\r\n\x00\xffb\r\n", [][]string{{"ECHO", "a\r\n\x00\xffb"}}, ""},
		{"empty argument", "*2\r\n$4\r\nECHO\r\n$0\r\n\r\n", [][]string{{"ECHO", ""}}, ""},
		{"pipelined", "*1\r\n$4\r\nPING\r\n*1\r\n$4\r\nPING\r\nPING\r\n", [][]string{{"PING"}, {"PING"}, {"PING"}}, ""},
		{"empty requests are skipped", "*0\r\n*-1\r\n\r\n  \r\n\n*1\r\n$4\r\nPING\r\n", [][]string{{"PING"}}, ""},
		{"inline", "SET k v\r\n", [][]string{{"SET", "k", "v"}}, ""},
		{"inline with LF only", "GET k\n", [][]string{{"GET", "k"}}, ""},
		{"inline blanks", " \t SET\t k  v \r\n", [][]string{{"SET", "k", "v"}}, ""},
		{"inline double quotes", `SET "a b" "\x41\n\"\\\q"` + "\r\n", [][]string{{"SET", "a b", "A\n\"\\q"}}, ""},
		{"inline single quotes", `SET 'it\'s' '\n'` + "\r\n", [][]string{{"SET", "it's", `\n`}}, ""},
		{"inline quote inside a word", `SET ab"c d"e` + "\r\n", nil, "Protocol error: unbalanced quotes in request"},
		{"inline quote opens mid word", `SET ab"c d" e` + "\r\n", [][]string{{"SET", "abc d", "e"}}, ""},
		{"inline empty quotes", `SET k ""` + "\r\n", [][]string{{"SET", "k", ""}}, ""},
		{"inline NUL ends the line", "PING\x00junk\r\n", [][]string{{"PING"}}, ""},
		{"inline unbalanced", "SET \"k v\r\n", nil, "Protocol error: unbalanced quotes in request"},
		{"inline unbalanced single", "SET 'k\r\n", nil, "Protocol error: unbalanced quotes in request"},
		{"inline too long", long + "\r\n", nil, "Protocol error: too big inline request"},
		{"inline too long without newline", long, nil, "Protocol error: too big inline request"},
		{"multibulk count not a number", "*x\r\n", nil, "Protocol error: invalid multibulk length"},
		{"multibulk count with plus", "*+1\r\n", nil, "Protocol error: invalid multibulk length"},
		{"multibulk count without CR", "*1\n$4\r\nPING\r\n", nil, "Protocol error: invalid multibulk length"},
		{"multibulk count too big", "*17\r\n", nil, "Protocol error: invalid multibulk length"},
		{"multibulk count line too long", "*" + long, nil, "Protocol error: too big mbulk count string"},
		{"not a bulk string", "*1\r\n+PING\r\n", nil, "Protocol error: expected '$', got '+'"},
		{"empty bulk header", "*1\r\n\r\n", nil, "Protocol error: expected '$', got '\r'"},
		{"bulk length negative", "*1\r\n$-1\r\n", nil, "Protocol error: invalid bulk length"},
		{"bulk length not a number", "*1\r\n$1x\r\nP\r\n", nil, "Protocol error: invalid bulk length"},
		{"bulk length leading zero", "*1\r\n$04\r\nPING\r\n", nil, "Protocol error: invalid bulk length"},
		{"bulk too big", "*1\r\n$1025\r\n", nil, "Protocol error: invalid bulk length"},
		{"bulk length line too long", "*1\r\n$" + long, nil, "Protocol error: too big bulk count string"},
		{"bulk without CRLF", "*1\r\n$4\r\nPINGxx", nil, "Protocol error: expected CRLF after bulk string"},
		{"request too big", "*5\r\n" + strings.Repeat("$1000\r\n"+strings.Repeat("v", 1000)+"\r\n", 5), nil, "Protocol error: too big request"},
		{"EOF in bulk", "*1\r\n$4\r\nPI", nil, io.ErrUnexpectedEOF.Error()},
		{"EOF in header", "*2\r\n$4\r\nPING\r\n", nil, io.ErrUnexpectedEOF.Error()},
		{"EOF in inline", "PING", nil, io.ErrUnexpectedEOF.Error()},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			// The smallest bufio buffer (16) makes lines span buffer refills.
			for _, size := range []int{16, 4096} {
				reqs, err := readAll(tt.input, testLimits, size)
				if diff := cmp.Diff(tt.want, reqs); diff != "" {
					t.Errorf("buffer %d: requests (-want +got):\n%s", size, diff)
				}
				if tt.err == "" {
					if err != io.EOF {
						t.Errorf("buffer %d: error %v, want io.EOF", size, err)
					}
					continue
				}
				if err == nil || err.Error() != tt.err {
					t.Errorf("buffer %d: error %v, want %q", size, err, tt.err)
				}
				var pe *ProtocolError
				if strings.HasPrefix(tt.err, "Protocol error") && !errors.As(err, &pe) {
					t.Errorf("buffer %d: error %T, want *ProtocolError", size, err)
				}
			}
		})
	}
}

func TestParseInt(t *testing.T) {
	good := map[string]int64{
		"0": 0, "1": 1, "-1": -1, "42": 42,
		"9223372036854775807":  1<<63 - 1,
		"-9223372036854775808": -1 << 63,
	}
	for s, want := range good {
		if got, ok := parseInt([]byte(s)); !ok || got != want {
			t.Errorf("parseInt(%q) = %d, %v; want %d", s, got, ok, want)
		}
	}
	for _, s := range []string{"", "-", "+1", " 1", "1 ", "01", "-0", "1.0", "0x1", "9223372036854775808",
		"-9223372036854775809", "18446744073709551616", "99999999999999999999", "123456789012345678901"} {
		if got, ok := parseInt([]byte(s)); ok {
			t.Errorf("parseInt(%q) = %d, true; want false", s, got)
		}
	}
}

// encode writes args as a RESP multibulk request.
func encode(args ...string) []byte {
	var b bytes.Buffer
	b.WriteString("*" + strconv.Itoa(len(args)) + "\r\n")
	for _, a := range args {
		b.WriteString("$" + strconv.Itoa(len(a)) + "\r\n" + a + "\r\n")
	}
	return b.Bytes()
}

// FuzzParse feeds arbitrary bytes to the request reader: it must never
// panic, must hold every limit, must allocate in proportion to the bytes it
// was sent (not to lengths a client announces), and what it reads must
// survive being written out and read back.
func FuzzParse(f *testing.F) {
	for _, seed := range []string{
		"*2\r\n$3\r\nGET\r\n$1\r\nk\r\n",
		"*3\r\n$3\r\nSET\r\n$1\r\nk\r\n$3\r\nv\r\n\r\n",
		"PING\r\nSET \"a\\x41\" 'b\\''\r\n",
		"*1\r\n$1024\r\nxx",
		"*16\r\n",
		"*1\r\n$-1\r\n",
		"\x00\r\n*0\r\n",
	} {
		f.Add([]byte(seed))
	}
	l := limits{maxBulk: 1 << 10, maxArgs: 64, maxInline: 128, maxRequest: 2 << 10}
	f.Fuzz(func(t *testing.T, input []byte) {
		rr := newRequestReader(bytes.NewReader(input), 16, l)
		for {
			args, err := rr.ReadRequest()
			if err != nil {
				var pe *ProtocolError
				if err != io.EOF && err != io.ErrUnexpectedEOF && !errors.As(err, &pe) {
					t.Fatalf("unexpected error %T %v", err, err)
				}
				break
			}
			if len(args) == 0 || len(args) > l.maxArgs {
				t.Fatalf("%d arguments", len(args))
			}
			total := 0
			for _, a := range args {
				if len(a) > l.maxBulk {
					t.Fatalf("argument of %d bytes", len(a))
				}
				total += len(a)
			}
			if total > l.maxRequest {
				t.Fatalf("request of %d bytes", total)
			}
			// Buffers grow at most one chunk ahead of what was received.
			if limit := 2*len(input) + 2*bulkChunk; cap(rr.arena) > limit {
				t.Fatalf("arena of %d bytes from %d bytes of input", cap(rr.arena), len(input))
			}
			strs := make([]string, len(args))
			for i, a := range args {
				strs[i] = string(a)
			}
			again, err := readAll(string(encode(strs...)), l, 16)
			if err != io.EOF || len(again) != 1 || !cmp.Equal(again[0], strs) {
				t.Fatalf("round trip of %q: %q, %v", strs, again, err)
			}
		}
	})
}
