package session

import (
	"slices"
	"testing"
)

func TestResumeOrder(t *testing.T) {
	paths := []Path{{Name: "rdma 1"}, {Name: "rdma 2"}, {Name: "rdma 3"}, {Name: "tcp", TCP: true}}
	for _, tc := range []struct {
		failed int
		dead   bool
		want   []int
	}{
		{0, false, []int{1, 2, 0, 3}}, // path 1 broke: the others first, TCP last
		{1, false, []int{2, 0, 1, 3}},
		{2, false, []int{0, 1, 2, 3}},
		{0, true, []int{1, 2, 3, 0}},  // path 1 went silent: after TCP
		{3, false, []int{0, 1, 2, 3}}, // off TCP: back to RDMA in order
		{3, true, []int{0, 1, 2, 3}},
	} {
		if got := resumeOrder(paths, tc.failed, tc.dead); !slices.Equal(got, tc.want) {
			t.Errorf("resumeOrder after path %d broke (dead %v): %v, want %v", tc.failed, tc.dead, got, tc.want)
		}
	}
	if got := resumeOrder(paths[:1], 0, true); !slices.Equal(got, []int{0}) {
		t.Errorf("one path: %v", got)
	}
}
