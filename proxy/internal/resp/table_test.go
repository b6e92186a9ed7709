package resp

import (
	"strings"
	"testing"
)

// TestTableConsistent checks the facts of the command table against each
// other: a command that blocks or waits never shares a connection, one
// that waits also blocks, a subscription is never shared, and a split
// command has keys (no server-wide flag).
func TestTableConsistent(t *testing.T) {
	for name, i := range commands {
		if i.Has(Blocking) && !i.Has(Dedicated) {
			t.Errorf("%s blocks but may share a connection", name)
		}
		if i.Has(Waits) && !i.Has(Blocking) {
			t.Errorf("%s waits but is not blocking", name)
		}
		if i.Has(Subscribes) && !i.Has(Dedicated) {
			t.Errorf("%s subscribes but may share a connection", name)
		}
		if i.Has(Splits) && i.Has(NoSlot) {
			t.Errorf("%s is split by slot and routed by none", name)
		}
		if Stateless([]byte(name)) == i.Has(Dedicated) {
			t.Errorf("Stateless(%s) disagrees with Dedicated", name)
		}
		for sub, s := range i.Sub {
			if s.Sub != nil {
				t.Errorf("%s %s has subcommands of its own", name, sub)
			}
		}
	}
	if Stateless(nil) {
		t.Error("no command is stateless")
	}
	if !Stateless([]byte("get")) {
		t.Error("GET is stateless")
	}
}

// TestOf checks that a subcommand's facts add to the command's, whatever
// the case of the subcommand.
func TestOf(t *testing.T) {
	tests := []struct {
		args []string
		f    Flag
		want bool
	}{
		{[]string{"client", "SetName", "x"}, EveryConn, true},
		{[]string{"client", "setname", "x"}, Dedicated | NoSlot, true},
		{[]string{"client", "list"}, EveryConn, false},
		{[]string{"client"}, EveryConn, false},
		{[]string{"auth", "pw"}, EveryConn, true},
		{[]string{"acl", "SETUSER", "u"}, Fanned | ChangesAccess, true},
		{[]string{"acl", "list"}, Fanned, false},
		{[]string{"info"}, Fanned, true},
		{[]string{"config", "get", "x"}, Fanned, false},
		{[]string{"config", "set", "x", "y"}, Fanned, true},
		{[]string{"slowlog", "get"}, Fanned, true},
		{[]string{"get", "k"}, Fanned, false},
	}
	for _, tt := range tests {
		args := make([][]byte, len(tt.args))
		for i, a := range tt.args {
			args[i] = []byte(a)
		}
		if got := Of(args[0], args).Has(tt.f); got != tt.want {
			t.Errorf("Of(%q).Has(%b) = %v, want %v", tt.args, tt.f, got, tt.want)
		}
	}
}

// BenchmarkStateless is the cost of the question every forwarded command
// asks.
func BenchmarkStateless(b *testing.B) {
	names := [][]byte{[]byte("get"), []byte("set"), []byte("blpop"), []byte("client")}
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		Stateless(names[i%len(names)])
	}
}

// TestIndex checks that the index finds every command of the overlay and
// only those.
func TestIndex(t *testing.T) {
	for name, i := range commands {
		if len(name) > maxName {
			t.Fatalf("%s is longer than maxName", name)
		}
		if got := Lookup([]byte(name)); got.Flags != i.Flags || got.Merge != i.Merge || got.Family != i.Family {
			t.Errorf("Lookup(%s) = %+v, want %+v", name, got, i)
		}
	}
	for _, name := range []string{"", "get", "GET", "selec", "selectx", "zzzzzzzzzzzzzzzzzzzzzzzz", "1", "~"} {
		if got := Lookup([]byte(name)); got.Flags != 0 {
			t.Errorf("Lookup(%q) = %+v, want nothing", name, got)
		}
	}
}

// TestEffect checks what the table says commands do to their connection:
// a command with an Effect never shares a connection (the proxy learns
// and replays it there), subscriptions say their family, and a CLIENT
// subcommand's Effect is the command's with it.
func TestEffect(t *testing.T) {
	for name, i := range commands {
		if i.Effect != NoEffect && !i.Has(Dedicated) {
			t.Errorf("%s changes its connection but may share one", name)
		}
		if i.Effect != NoEffect && !Affects([]byte(name)) {
			t.Errorf("Affects(%s) is false", name)
		}
		for sub, si := range i.Sub {
			if si.Effect != NoEffect && !Affects([]byte(name)) {
				t.Errorf("Affects(%s) is false, and %s %s has an Effect", name, name, sub)
			}
		}
		if i.Has(Subscribes) != (i.Effect == EffectSubscribe || i.Effect == EffectUnsubscribe) {
			t.Errorf("%s: Subscribes and Effect %d disagree", name, i.Effect)
		}
	}
	tests := []struct {
		give []string
		want Effect
	}{
		{[]string{"client", "REPLY", "off"}, EffectReplyMode},
		{[]string{"client", "SetName", "x"}, EffectSetName},
		{[]string{"client", "tracking", "on"}, EffectTracking},
		{[]string{"client", "id"}, EffectClientID},
		{[]string{"client", "KILL", "ID", "7"}, EffectKill},
		{[]string{"client", "getname"}, NoEffect},
		{[]string{"client"}, NoEffect},
		{[]string{"psubscribe", "p*"}, EffectSubscribe},
		{[]string{"sunsubscribe"}, EffectUnsubscribe},
		{[]string{"psync", "?", "-1"}, EffectSync},
		{[]string{"get", "k"}, NoEffect},
	}
	for _, tt := range tests {
		args := make([][]byte, len(tt.give))
		for i, a := range tt.give {
			args[i] = []byte(a)
		}
		if got := Of(args[0], args).Effect; got != tt.want {
			t.Errorf("Of(%q).Effect = %d, want %d", tt.give, got, tt.want)
		}
		if got, _ := EffectOf(args[0], args); got != tt.want {
			t.Errorf("EffectOf(%q) = %d, want %d", tt.give, got, tt.want)
		}
	}
}

// TestMovableKeys checks MIGRATE's keys against Redis's own COMMAND
// GETKEYS answers (redis-server 7.0.15): the key argument, or with an
// empty one the arguments after KEYS; AUTH and AUTH2 passwords are no
// keys.
func TestMovableKeys(t *testing.T) {
	for _, tc := range []struct {
		give string
		want []string
	}{
		{"MIGRATE h 1 k 0 10", []string{"k"}},
		{"MIGRATE h 1 k 0 10 AUTH pw", []string{"k"}},
		{"MIGRATE h 1 k 0 10 COPY REPLACE AUTH2 user pw", []string{"k"}},
		{"MIGRATE h 1 \"\" 0 10 AUTH pw KEYS a b", []string{"a", "b"}},
		{"MIGRATE h 1 \"\" 0 10 KEYS a", []string{"a"}},
		{"MIGRATE h 1 k 0 10 KEYS a", nil}, // Redis: "Invalid arguments specified for command"
	} {
		var args [][]byte
		for _, f := range strings.Fields(tc.give) {
			if f == `""` {
				f = ""
			}
			args = append(args, []byte(f))
		}
		keys, ok := MovableKeys([]byte("migrate"), args)
		var got []string
		for _, k := range keys {
			got = append(got, string(k))
		}
		if !ok || strings.Join(got, " ") != strings.Join(tc.want, " ") {
			t.Errorf("%s: keys %q (%v), want %q", tc.give, got, ok, tc.want)
		}
	}
	if _, ok := MovableKeys([]byte("sort"), nil); ok {
		t.Error("SORT's keys found without COMMAND GETKEYS")
	}
}

func TestKillID(t *testing.T) {
	tests := []struct {
		give string
		id   int64
		ok   bool
	}{
		{"CLIENT KILL ID 7", 7, true},
		{"client kill id 7 skipme no", 7, true},
		{"CLIENT KILL TYPE normal ID 3 ID 9", 9, true}, // the last, as Redis
		{"CLIENT KILL 127.0.0.1:6379", 0, false},       // the old form
		{"CLIENT KILL TYPE normal", 0, false},
		{"CLIENT KILL ID x", 0, false}, // Redis's error
		{"CLIENT KILL", 0, false},
	}
	for _, tt := range tests {
		var args [][]byte
		for _, a := range strings.Fields(tt.give) {
			args = append(args, []byte(a))
		}
		if id, ok := KillID(args); id != tt.id || ok != tt.ok {
			t.Errorf("KillID(%q) = %d, %v, want %d, %v", tt.give, id, ok, tt.id, tt.ok)
		}
	}
}
