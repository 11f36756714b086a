package bench

import (
	"slices"
	"strings"
	"testing"
)

func TestParseCPUSplit(t *testing.T) {
	for _, tc := range []struct {
		in           string
		server, cli  []int
		err, printed string
	}{
		{in: "0-7/8-15", server: []int{0, 1, 2, 3, 4, 5, 6, 7}, cli: []int{8, 9, 10, 11, 12, 13, 14, 15}, printed: "0-7/8-15"},
		{in: "0,2,4-5/1, 3", server: []int{0, 2, 4, 5}, cli: []int{1, 3}, printed: "0,2,4-5/1,3"},
		{in: "3,1-2,2/0", server: []int{1, 2, 3}, cli: []int{0}, printed: "1-3/0"},
		{in: "0-7", err: "want SERVER/CLIENT"},
		{in: "0-7/7-15", err: "CPU 7 is on both sides"},
		{in: "7-0/8", err: "bad entry"},
		{in: "a/1", err: "server CPUs"},
		{in: "0/", err: "client CPUs"},
		{in: "0/1024", err: "0 to 1023"},
		{in: "-1/2", err: "bad entry"},
	} {
		sp, err := ParseCPUSplit(tc.in)
		if tc.err != "" {
			if err == nil || !strings.Contains(err.Error(), tc.err) {
				t.Errorf("%q: %v, want an error saying %q", tc.in, err, tc.err)
			}
			continue
		}
		if err != nil || !slices.Equal(sp.Server, tc.server) || !slices.Equal(sp.Client, tc.cli) || sp.String() != tc.printed {
			t.Errorf("%q: %v %v %q %v; want %v %v %q", tc.in, sp.Server, sp.Client, sp.String(), err, tc.server, tc.cli, tc.printed)
		}
	}
}
