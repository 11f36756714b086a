package verbstest

import (
	"strings"
	"testing"

	"github.com/mwrpc/mwrpc/transport/verbs"
)

// TestCaseNames checks the case table: IDs unique, names in the <ID>_<short_name> form
// with a short name of lower-case words, and every row of the design brief's table
// present.
func TestCaseNames(t *testing.T) {
	seen := make(map[string]bool)
	rows := make(map[string]bool)
	for _, c := range allCases() {
		if seen[c.id] {
			t.Errorf("case ID %s twice", c.id)
		}
		seen[c.id] = true
		rows[rowOf(c.id)] = true
		if c.name == "" || strings.Trim(c.name, "abcdefghijklmnopqrstuvwxyz0123456789_") != "" {
			t.Errorf("case %s: short name %q is not lower_snake_case", c.id, c.name)
		}
		if c.run == nil {
			t.Errorf("case %s has no function", c.id)
		}
	}
	for _, row := range strings.Fields("K1 B1 B2 B3 B4 B5 B6 R1 R2 R3 R4 R5 R6 I1 I2 I3 I4 I5 O1 O2 O3 O4 O5 S1 S2 Q1 Q2 Q3 Q4 Q5 Q6 Q7") {
		if !rows[row] {
			t.Errorf("row %s of the conformance table has no case", row)
		}
	}
	if n := len(seen); n < 30 {
		t.Errorf("%d cases, want at least 30", n)
	}
	t.Logf("%d cases: %s", len(seen), strings.Join(CaseIDs(), " "))
}

// TestDivergentCase checks the divergence machinery without a provider: in a case marked
// divergent, unmet expectations are logged rather than failed, a fatal one ends the case
// without failing it, and DivergentCheck sees everything that was observed.
func TestDivergentCase(t *testing.T) {
	var got *Observation
	f := &Fixture{
		Name:      "fake",
		Divergent: map[string]string{"R6": "the fake provider checks only the MR"},
		DivergentCheck: map[string]func(testing.TB, Observation){
			"R6": func(_ testing.TB, o Observation) { got = &o },
		},
	}
	wc := verbs.WorkCompletion{WRID: 7, Status: verbs.WCSuccess, Opcode: verbs.WCRDMARead}
	reached := false
	ok := t.Run("R6_past_window_end", func(t *testing.T) {
		runCase(t, f, testCase{"R6", "past_window_end", func(e *env) {
			e.record([]verbs.WorkCompletion{wc})
			e.Errorf("READ past the window: status SUCCESS, want REM_ACCESS_ERR")
			e.Fatalf("no flush")
			reached = true
		}})
	})
	if !ok {
		t.Fatal("a divergent case failed the test")
	}
	if reached {
		t.Error("Fatalf in a divergent case did not end the case")
	}
	if got == nil {
		t.Fatal("DivergentCheck was not called")
	}
	if got.Case != "R6" || got.Reason == "" || !got.Stopped || len(got.Mismatches) != 2 ||
		len(got.Completions) != 1 || got.Completions[0] != wc {
		t.Errorf("observation %+v", *got)
	}

	// A row key covers the lettered cases of the row.
	f.Divergent = map[string]string{"R2": "row"}
	if key, reason := f.divergence("R2c"); key != "R2" || reason != "row" {
		t.Errorf("divergence(R2c) = %q, %q; want the row's entry", key, reason)
	}
	if key, _ := f.divergence("R3a"); key != "" {
		t.Errorf("divergence(R3a) = %q, want none", key)
	}
}
