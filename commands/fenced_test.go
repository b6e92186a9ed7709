package commands

import (
	"context"
	"fmt"
	"slices"
	"testing"
)

func TestParseFenced(t *testing.T) {
	h := mustNew(t, nil, Config{MaxTTL: testConfig.MaxTTL, MaxWait: testConfig.MaxWait, MaxPermits: 8}, nil)
	arity := "ERR wrong number of arguments for 'fenced' command"
	notFence := "ERR fence is not a positive integer"
	badSlot := "ERR PERMIT slot is not an integer from 0 to 7"
	tests := []struct {
		give    []string
		want    Fenced
		wantErr string
	}{
		{give: []string{"FENCED", "r", "7", "GET", "k"}, want: Fenced{Resource: []byte("r"), Fence: 7, Slot: -1, Command: argv("GET", "k")}},
		{give: []string{"fenced", "r", "9223372036854775807", "SET", "k", "v"}, want: Fenced{Resource: []byte("r"), Fence: 1<<63 - 1, Slot: -1, Command: argv("SET", "k", "v")}},
		{give: []string{"FENCED", "r", "7", "permit", "3", "GET", "k"}, want: Fenced{Resource: []byte("r"), Fence: 7, Slot: 3, Command: argv("GET", "k")}},
		{give: []string{"FENCED", "r", "7", "PERMIT", "0", "PING"}, want: Fenced{Resource: []byte("r"), Fence: 7, Slot: 0, Command: argv("PING")}},
		{give: []string{"FENCED", "r", "7", "PERMIT"}, wantErr: arity},
		{give: []string{"FENCED"}, wantErr: arity},
		{give: []string{"FENCED", "r", "7"}, wantErr: arity},
		{give: []string{"FENCED", "r", "7", "PERMIT", "1"}, wantErr: arity},
		{give: []string{"FENCED", "r", "0", "GET", "k"}, wantErr: notFence},
		{give: []string{"FENCED", "r", "-3", "GET", "k"}, wantErr: notFence},
		{give: []string{"FENCED", "r", "07", "GET", "k"}, wantErr: notFence},
		{give: []string{"FENCED", "r", "+7", "GET", "k"}, wantErr: notFence},
		{give: []string{"FENCED", "r", " 7", "GET", "k"}, wantErr: notFence},
		{give: []string{"FENCED", "r", "", "GET", "k"}, wantErr: notFence},
		{give: []string{"FENCED", "r", "9223372036854775808", "GET", "k"}, wantErr: notFence},
		{give: []string{"FENCED", "r", "7", "PERMIT", "8", "GET", "k"}, wantErr: badSlot},
		{give: []string{"FENCED", "r", "7", "PERMIT", "-1", "GET", "k"}, wantErr: badSlot},
		{give: []string{"FENCED", "r", "7", "PERMIT", "01", "GET", "k"}, wantErr: badSlot},
		{give: []string{"FENCED", "r", "7", "PERMIT", "x", "GET", "k"}, wantErr: badSlot},
	}
	for _, tt := range tests {
		got, err := h.ParseFenced(argv(tt.give...))
		if errText(err) != tt.wantErr {
			t.Errorf("ParseFenced(%q) error %q, want %q", tt.give, errText(err), tt.wantErr)
			continue
		}
		if err == nil && fmt.Sprintf("%q %d %d %q", got.Resource, got.Fence, got.Slot, got.Command) != fmt.Sprintf("%q %d %d %q", tt.want.Resource, tt.want.Fence, tt.want.Slot, tt.want.Command) {
			t.Errorf("ParseFenced(%q) = %+v, want %+v", tt.give, got, tt.want)
		}
	}
}

// TestFencedCounted: CountFenced shows in INFO's cmd_fenced, and a Conn
// asked to serve FENCED (no backend to run it on) refuses it.
func TestFencedCounted(t *testing.T) {
	h := mustNew(t, nil, DefaultConfig(), nil)
	for _, o := range []FencedOutcome{FencedAccepted, FencedAccepted, FencedStale, FencedError, FencedBadRequest} {
		h.CountFenced(o)
	}
	c := h.NewConn()
	defer c.Close()
	if got := string(c.Serve(context.Background(), nil, argv("FENCED", "r", "1", "GET", "k"), false)); got != "-ERR FENCED needs a backend to run its command on\r\n" {
		t.Errorf("Serve(FENCED) = %q", got)
	}
	if got := h.Info(); !slices.Contains(splitLines(got), "cmd_fenced:accepted=2,stale=1,error=2,bad_request=1") {
		t.Errorf("Info() = %q", got)
	}
}

func splitLines(s string) []string {
	var out []string
	for len(s) > 0 {
		i := 0
		for i < len(s) && s[i] != '\r' {
			i++
		}
		out = append(out, s[:i])
		s = s[min(i+2, len(s)):]
	}
	return out
}
