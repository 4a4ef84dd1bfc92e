package kvserver

import (
	"strings"
	"testing"
	"time"
)

func TestGlobMatch(t *testing.T) {
	tests := []struct {
		pattern, s string
		want       bool
	}{
		{"", "", true},
		{"", "a", false},
		{"a", "", false},
		{"*", "", true},
		{"*", "anything/at all", true},
		{"h?llo", "hello", true},
		{"h?llo", "hllo", false},
		{"h*llo", "hllo", true},
		{"h*llo", "heeeello", true},
		{"h*llo", "hello!", false},
		{"h[ae]llo", "hallo", true},
		{"h[ae]llo", "hillo", false},
		{"h[^e]llo", "hallo", true},
		{"h[^e]llo", "hello", false},
		{"h[a-b]llo", "hbllo", true},
		{"h[b-a]llo", "hbllo", true}, // a reversed range still counts
		{"h[a-b]llo", "hcllo", false},
		{`h\*llo`, "h*llo", true},
		{`h\*llo`, "hello", false},
		{`[\]]`, "]", true},
		{"[]", "a", false},
		{"[^]", "a", true},
		{"[abc", "b", true}, // an unclosed set ends with the pattern
		{"a/*", "a/b/c", true},
		{`a\`, `a\`, true},
		{"**a", "ba", true},
		{"*a*b", "xaxxb", true},
		{"*a*b", "xaxxbx", false},
		{"user:*:name", "user:42:name", true},
	}
	for _, tt := range tests {
		if got := globMatch(tt.pattern, tt.s); got != tt.want {
			t.Errorf("globMatch(%q, %q) = %v, want %v", tt.pattern, tt.s, got, tt.want)
		}
	}
}

// TestGlobMatchPathological: a pattern that makes naive backtracking
// exponential takes no time.
func TestGlobMatchPathological(t *testing.T) {
	pattern := strings.Repeat("*a", 30) + "b"
	s := strings.Repeat("a", 10000)
	start := time.Now()
	if globMatch(pattern, s) {
		t.Fatal("matched")
	}
	if d := time.Since(start); d > 2*time.Second {
		t.Fatalf("took %v", d)
	}
}
