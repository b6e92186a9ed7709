package commands

import (
	"context"
	"slices"
	"strings"
	"testing"
)

// TestSpecs checks the table of commands against itself and against the
// parsers: every outcome belongs to exactly one command, and a command with
// fewer arguments than its arity gets the arity error.
func TestSpecs(t *testing.T) {
	seen := map[outcome]string{}
	for _, s := range specs {
		if s.name == "" || strings.ToLower(s.name) != s.name || strings.Trim(s.name, "abcdefghijklmnopqrstuvwxyz") != "" {
			t.Errorf("name %q: want lower-case ASCII letters", s.name)
		}
		if s.serve == nil || s.summary == "" || len(s.args) == 0 || len(s.flags) == 0 {
			t.Errorf("%s: serve, summary, args and flags are required", s.name)
		}
		for _, o := range s.outcomes {
			if other, ok := seen[o]; ok {
				t.Errorf("outcome %s of %s is also listed by %s", outcomeNames[o], s.name, other)
			}
			seen[o] = s.name
		}
	}
	if len(seen) != int(numOutcomes) {
		t.Errorf("%d outcomes belong to a command, want all %d", len(seen), numOutcomes)
	}

	h := mustNew(t, nil, DefaultConfig(), nil)
	c := h.NewConn()
	defer c.Close()
	for _, s := range specs {
		n := s.arity
		if n < 0 {
			n = -n
		}
		args := make([]string, n-1)
		args[0] = strings.ToUpper(s.name)
		want := "-ERR wrong number of arguments for '" + s.name + "' command\r\n"
		if got := string(c.Serve(context.Background(), nil, argv(args...), false)); got != want {
			t.Errorf("%q (arity %d) = %q, want %q", args, s.arity, got, want)
		}
	}
}

func TestNames(t *testing.T) {
	names := Names()
	if want := []string{"lock", "unlock", "extend", "mlock", "rlock", "lockinfo", "locks", "fenced"}; !slices.Equal(names, want) {
		t.Fatalf("Names() = %q, want %q", names, want)
	}
	names[0] = "changed"
	if Names()[0] != "lock" {
		t.Error("changing the slice Names returned changed the commands")
	}
}

func TestCommandInfoAndDocs(t *testing.T) {
	tests := []struct {
		name  string
		resp3 bool
		want  string
	}{
		{
			name: "lock",
			want: "*10\r\n$4\r\nlock\r\n:-3\r\n*1\r\n+write\r\n:0\r\n:0\r\n:0\r\n*3\r\n+@write\r\n+@slow\r\n+@lock\r\n*0\r\n*0\r\n*0\r\n",
		},
		{
			name: "unlock", resp3: true,
			want: "*10\r\n$6\r\nunlock\r\n:-2\r\n~1\r\n+write\r\n:0\r\n:0\r\n:0\r\n~3\r\n+@write\r\n+@slow\r\n+@lock\r\n*0\r\n*0\r\n*0\r\n",
		},
		{name: "get", want: "*-1\r\n"},
		{name: "get", resp3: true, want: "_\r\n"},
	}
	for _, tt := range tests {
		if got := string(AppendCommandInfo(nil, tt.name, tt.resp3)); got != tt.want {
			t.Errorf("AppendCommandInfo(%s, resp3=%v) = %q, want %q", tt.name, tt.resp3, got, tt.want)
		}
	}
	docs := string(AppendCommandDocs(nil, "extend", true))
	for _, want := range []string{
		"%5\r\n$7\r\nsummary\r\n",
		"$6\r\nttl-ms\r\n$4\r\ntype\r\n$7\r\ninteger\r\n",
		"%3\r\n$4\r\nname\r\n$5\r\ntoken\r\n$4\r\ntype\r\n$6\r\nstring\r\n$5\r\nflags\r\n~1\r\n+optional\r\n",
	} {
		if !strings.Contains(docs, want) {
			t.Errorf("AppendCommandDocs(extend) = %q, lacks %q", docs, want)
		}
	}
	docs = string(AppendCommandDocs(nil, "locks", false))
	for _, want := range []string{
		"$6\r\ncursor\r\n$4\r\ntype\r\n$7\r\ninteger\r\n",
		"$7\r\npattern\r\n$4\r\ntype\r\n$7\r\npattern\r\n$5\r\ntoken\r\n$5\r\nMATCH\r\n$5\r\nflags\r\n*1\r\n+optional\r\n",
		"$5\r\ncount\r\n$4\r\ntype\r\n$7\r\ninteger\r\n$5\r\ntoken\r\n$5\r\nCOUNT\r\n",
	} {
		if !strings.Contains(docs, want) {
			t.Errorf("AppendCommandDocs(locks) = %q, lacks %q", docs, want)
		}
	}
	if got := string(AppendCommandInfo(nil, "locks", false)); got != "*10\r\n$5\r\nlocks\r\n:-2\r\n*1\r\n+readonly\r\n:0\r\n:0\r\n:0\r\n*3\r\n+@read\r\n+@slow\r\n+@lock\r\n*0\r\n*0\r\n*0\r\n" {
		t.Errorf("AppendCommandInfo(locks) = %q", got)
	}
	if got := string(AppendCommandDocs(nil, "get", false)); got != "*-1\r\n" {
		t.Errorf("AppendCommandDocs(get) = %q, want a null", got)
	}
}

// TestInfo counts bad requests, which never reach a lock node, and reads
// them back from INFO's lines.
func TestInfo(t *testing.T) {
	h := mustNew(t, nil, DefaultConfig(), nil)
	c := h.NewConn()
	defer c.Close()
	for _, args := range [][]string{{"LOCK"}, {"LOCK", "r", "x"}, {"UNLOCK"}, {"EXTEND", "r", "0", "t"}} {
		c.Serve(context.Background(), nil, argv(args...), false)
	}
	want := "proxy_id:" + h.ID() + "\r\n" + "locks_acquired:0\r\nlocks_not_acquired:0\r\nlocks_noquorum:0\r\nlocks_released:0\r\nlocks_extended:0\r\n" +
		"keepalive_extensions:0\r\nkeepalive_lost:0\r\nlocks_held:0\r\n" +
		"cmd_lock:acquired=0,not_acquired=0,noquorum=0,error=0,bad_request=2\r\n" +
		"cmd_unlock:released=0,not_held=0,noquorum=0,error=0,bad_request=1\r\n" +
		"cmd_extend:extended=0,not_held=0,noquorum=0,error=0,bad_request=1\r\n" +
		"cmd_mlock:acquired=0,not_acquired=0,noquorum=0,error=0,bad_request=0\r\n" +
		"cmd_rlock:acquired=0,not_acquired=0,noquorum=0,error=0,bad_request=0\r\n" +
		"cmd_lockinfo:answered=0,noquorum=0,error=0,bad_request=0\r\n" +
		"cmd_locks:answered=0,noquorum=0,error=0,bad_request=0\r\n" +
		"cmd_fenced:accepted=0,stale=0,error=0,bad_request=0\r\n"
	if len(h.ID()) != 16 {
		t.Errorf("ID() = %q, want 16 hex digits", h.ID())
	}
	if got := h.Info(); got != want {
		t.Errorf("Info() =\n%s\nwant\n%s", got, want)
	}
}
