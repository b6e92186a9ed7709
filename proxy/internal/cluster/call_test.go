package cluster

import (
	"bytes"
	"testing"
)

// twoMasters is a slot map of two masters: slots 0-8191 and 8192-16383.
func twoMasters() *SlotMap {
	m := &SlotMap{Masters: []string{"a:1", "b:2"}, First: []int{0, 8192}}
	for i := range m.owner {
		m.owner[i] = uint16(i / 8192)
	}
	return m
}

// TestKeySlot checks Redis Cluster's key hashing against the values Redis
// itself gives (CLUSTER KEYSLOT), hash tags included.
func TestKeySlot(t *testing.T) {
	for key, want := range map[string]int{
		"foo":                  12182,
		"bar":                  5061,
		"{user1000}.following": KeySlot([]byte("user1000")),
		"{}.x":                 KeySlot([]byte("{}.x")), // an empty tag hashes the whole key
		"a{b":                  KeySlot([]byte("a{b")),
		"":                     0,
	} {
		if got := KeySlot([]byte(key)); got != want {
			t.Errorf("KeySlot(%q) = %d, want %d", key, got, want)
		}
	}
	if KeySlot([]byte("{user1000}.following")) != KeySlot([]byte("{user1000}.followers")) {
		t.Error("keys with the same hash tag are in different slots")
	}
}

// TestRedirected parses the error lines that send a command elsewhere.
func TestRedirected(t *testing.T) {
	tests := []struct {
		line string
		kind Redirection
		addr string
	}{
		{"-MOVED 3999 127.0.0.1:6381\r\n", RedirMoved, "127.0.0.1:6381"},
		{"-ASK 3999 127.0.0.1:6381\r\n", RedirAsk, "127.0.0.1:6381"},
		{"-TRYAGAIN Multiple keys request during rehashing of slot\r\n", RedirWait, ""},
		{"-CLUSTERDOWN The cluster is down\r\n", RedirWait, ""},
		{"-ERR wrong number of arguments\r\n", RedirNone, ""},
		{"-MOVED 3999\r\n", RedirNone, ""},
	}
	for _, tt := range tests {
		kind, addr := Redirected([]byte(tt.line))
		if kind != tt.kind || addr != tt.addr {
			t.Errorf("Redirected(%q) = %v %q, want %v %q", tt.line, kind, addr, tt.kind, tt.addr)
		}
	}
}

// TestSplitAndMerge splits an MGET of keys in both masters' slots and
// puts the parts' replies back in the client's order; DEL's counts add up.
func TestSplitAndMerge(t *testing.T) {
	m := twoMasters()
	args := [][]byte{[]byte("MGET"), []byte("foo"), []byte("bar"), []byte("{foo}x")}
	c := Split(m, []byte("mget"), OpArray, args)
	if c.Kind != CallMerge || len(c.Parts) != 2 || c.N != 3 {
		t.Fatalf("Split: kind %v, %d parts, n %d", c.Kind, len(c.Parts), c.N)
	}
	// foo and {foo}x hash to 12182 (b), bar to 5061 (a), in the order met.
	if c.Parts[0].Addr != "b:2" || c.Parts[1].Addr != "a:1" {
		t.Fatalf("parts go to %s and %s", c.Parts[0].Addr, c.Parts[1].Addr)
	}
	replies := [][]byte{
		[]byte("*2\r\n$1\r\n1\r\n$1\r\n3\r\n"), // foo, {foo}x
		[]byte("*1\r\n$-1\r\n"),                // bar
	}
	got, failed := Merge(&c, replies)
	if want := "*3\r\n$1\r\n1\r\n$-1\r\n$1\r\n3\r\n"; failed || string(got) != want {
		t.Errorf("Merge = %q %v, want %q", got, failed, want)
	}
	replies[1] = []byte("-ERR boom\r\n")
	if got, failed := Merge(&c, replies); !failed || string(got) != "-ERR boom\r\n" {
		t.Errorf("Merge with an error = %q %v", got, failed)
	}

	del := Split(m, []byte("del"), OpSum, [][]byte{[]byte("DEL"), []byte("foo"), []byte("bar")})
	if got, failed := Merge(&del, [][]byte{[]byte(":1\r\n"), []byte(":0\r\n")}); failed || string(got) != ":1\r\n" {
		t.Errorf("DEL's merge = %q %v", got, failed)
	}
	if c := Split(m, []byte("mset"), OpFirst, [][]byte{[]byte("MSET"), []byte("foo")}); c.Kind != CallLocal {
		t.Error("an MSET without a value is split")
	}
}

// TestScanCursor walks SCAN's cursor over the masters: a master's cursor
// in the high bits, the master in the low ones, the next master when one
// is done, 0 after the last.
func TestScanCursor(t *testing.T) {
	reply := func(cur string) []byte {
		return []byte("*2\r\n$" + string(rune('0'+len(cur))) + "\r\n" + cur + "\r\n*0\r\n")
	}
	if got := RewriteScan(reply("17"), 1, 2); !bytes.HasPrefix(got, []byte("*2\r\n$5\r\n17409\r\n")) {
		t.Errorf("cursor 17 on master 1 = %q", got) // 17<<10 | 1
	}
	if got := RewriteScan(reply("0"), 0, 2); !bytes.HasPrefix(got, []byte("*2\r\n$1\r\n1\r\n")) {
		t.Errorf("master 0 done = %q", got)
	}
	if got := RewriteScan(reply("0"), 1, 2); !bytes.HasPrefix(got, []byte("*2\r\n$1\r\n0\r\n")) {
		t.Errorf("last master done = %q", got)
	}
	if got := RewriteScan([]byte("-ERR x\r\n"), 0, 2); string(got) != "-ERR x\r\n" {
		t.Errorf("an error is rewritten: %q", got)
	}
}
