package fenced

import (
	"strings"
	"testing"

	"github.com/lockproxy/lockproxy/proxy/internal/cluster"
	"github.com/lockproxy/lockproxy/proxy/internal/resp"
)

func TestSlotTags(t *testing.T) {
	tags := slotTags()
	for slot, tag := range tags {
		if tag == "" || strings.ContainsAny(tag, "{}") || cluster.KeySlot([]byte(tag)) != slot {
			t.Fatalf("slot %d: tag %q hashes to %d", slot, tag, cluster.KeySlot([]byte(tag)))
		}
	}
	for _, tt := range []struct {
		resource string
		permit   int64
		slot     int
		want     string
	}{
		{"r", -1, cluster.NoSlot, "lockproxy:fence:r:r"},
		{"r", 3, cluster.NoSlot, "lockproxy:fence:p3:r"},
		{"a:b{c}", -1, cluster.NoSlot, "lockproxy:fence:r:a:b{c}"},
		{"r", -1, 0, "lockproxy:fence:{" + tags[0] + "}r:r"},
		{"r", 2, 16383, "lockproxy:fence:{" + tags[16383] + "}p2:r"},
	} {
		got := string(RecordKey([]byte(tt.resource), tt.permit, tt.slot))
		if got != tt.want {
			t.Errorf("RecordKey(%q, %d, %d) = %q, want %q", tt.resource, tt.permit, tt.slot, got, tt.want)
		}
		if tt.slot >= 0 && cluster.KeySlot([]byte(got)) != tt.slot {
			t.Errorf("record %q is in slot %d, want %d", got, cluster.KeySlot([]byte(got)), tt.slot)
		}
	}
}

func TestExecBody(t *testing.T) {
	for _, tt := range []struct {
		exec  string
		write bool
		want  string
		ok    bool
	}{
		{"*2\r\n+OK\r\n$1\r\nv\r\n", true, "$1\r\nv\r\n", true},
		{"*2\r\n+OK\r\n*2\r\n$1\r\na\r\n_\r\n", true, "*2\r\n$1\r\na\r\n_\r\n", true},
		{"*1\r\n%1\r\n$1\r\na\r\n,1.5\r\n", false, "%1\r\n$1\r\na\r\n,1.5\r\n", true},
		{"*1\r\n-WRONGTYPE x\r\n", false, "-WRONGTYPE x\r\n", true},
		{"*1\r\n$1\r\nv\r\n", true, "", false},
		{"*2\r\n-ERR x\r\n$1\r\nv\r\n", true, "", false},
	} {
		got, ok := execBody([]byte(tt.exec), tt.write)
		if ok != tt.ok || string(got) != tt.want {
			t.Errorf("execBody(%q, %v) = %q, %v; want %q, %v", tt.exec, tt.write, got, ok, tt.want, tt.ok)
		}
	}
}

func TestGuardSpec(t *testing.T) {
	rec := "lockproxy:fence:r:x"
	set := resp.KeySpec{First: 1, Last: 1, Step: 1, Write: true}
	get := resp.KeySpec{First: 1, Last: 1, Step: 1, Readonly: true}
	eval := resp.KeySpec{Movable: true}
	for _, tt := range []struct {
		spec resp.KeySpec
		args []string
		hit  int
		ok   bool
	}{
		{set, []string{"SET", rec, "1"}, 1, false},
		{set, []string{"SET", "k", rec}, 2, true}, // a value, not a key
		{get, []string{"GET", rec}, 1, true},
		{eval, []string{"EVAL", "return 1", "1", rec}, 3, false},
	} {
		args := make([][]byte, len(tt.args))
		for i, a := range tt.args {
			args[i] = []byte(a)
		}
		err := GuardSpec(tt.spec, args, tt.hit)
		if (err == nil) != tt.ok {
			t.Errorf("GuardSpec(%q) = %v, want ok %v", tt.args, err, tt.ok)
		}
	}
}
