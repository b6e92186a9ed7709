package commands

import "testing"

// TestParseReentrant: REENTRANT on LOCK and HOLD n on UNLOCK.
func TestParseReentrant(t *testing.T) {
	h := mustNew(t, nil, testConfig, nil)
	locks := []struct {
		give      []string
		reentrant bool
		err       string
	}{
		{give: []string{"LOCK", "r", "1000", "REENTRANT"}, reentrant: true},
		{give: []string{"LOCK", "r", "1000", "token", "t", "reentrant", "keepalive", "wait", "5"}, reentrant: true},
		{give: []string{"LOCK", "r", "1000", "REENTRANT", "Reentrant"}, err: errSyntax.Error()},
		{give: []string{"LOCK", "r", "1000"}},
	}
	for _, tt := range locks {
		a, err := h.parseLock(argv(tt.give...))
		if got := errText(err); got != tt.err || (err == nil && a.reentrant != tt.reentrant) {
			t.Errorf("parseLock(%q) = reentrant %v, %q; want %v, %q", tt.give, a.reentrant, got, tt.reentrant, tt.err)
		}
	}
	unlocks := []struct {
		give  []string
		token string
		hold  int64
		err   string
	}{
		{give: []string{"UNLOCK", "r", "t", "HOLD", "3"}, token: "t", hold: 3},
		{give: []string{"UNLOCK", "r", "t", "hold", "1"}, token: "t", hold: 1},
		{give: []string{"UNLOCK", "r", "t"}, token: "t"},
		{give: []string{"UNLOCK", "r", "t", "HOLD"}, err: errArityUnlock.Error()},
		{give: []string{"UNLOCK", "r", "HOLD", "1"}, err: errArityUnlock.Error()},
		{give: []string{"UNLOCK", "r", "t", "HOLD", "1", "x"}, err: errArityUnlock.Error()},
		{give: []string{"UNLOCK", "r", "t", "HOLDS", "1"}, err: errSyntax.Error()},
		{give: []string{"UNLOCK", "r", "t", "HOLD", "0"}, err: errHold.Error()},
		{give: []string{"UNLOCK", "r", "t", "HOLD", "-1"}, err: errHold.Error()},
		{give: []string{"UNLOCK", "r", "t", "HOLD", "01"}, err: errHold.Error()},
		{give: []string{"UNLOCK", "r", "", "HOLD", "1"}, err: errEmptyToken.Error()},
	}
	for _, tt := range unlocks {
		a, err := parseUnlock(argv(tt.give...))
		if got := errText(err); got != tt.err || (err == nil && (string(a.token) != tt.token || a.hold != tt.hold)) {
			t.Errorf("parseUnlock(%q) = token %q hold %d, %q; want %q, %d, %q", tt.give, a.token, a.hold, got, tt.token, tt.hold, tt.err)
		}
	}
}
