package quorum

import (
	"context"
	"reflect"
	"strings"
	"testing"
)

// TestOpsScriptHolds checks the operations of reentrant holds and LOCKINFO
// on one node: enter, sethold, query, view, the release of all holds, and
// that release, handoff, extend, cleanup and place keep or carry the count.
func TestOpsScriptHolds(t *testing.T) {
	c := startCluster(t, 1)
	a := c.admin[0]
	ctx := context.Background()
	a.Set(ctx, "lockproxy:intact", "1", 0)
	val := func() string { return a.Get(ctx, "lockproxy:lock:r").Val() }
	eq := func(what string, got, want any) {
		t.Helper()
		if !reflect.DeepEqual(got, want) {
			t.Fatalf("%s = %#v, want %#v", what, got, want)
		}
	}

	res := runOpsAt(t, a, "a1", 0, scriptOp{"r", "n", "tok", "10000;1.1;w%401"})
	eq("enter of a free lock", res[0], []any{int64(1), int64(1), int64(1), int64(1), int64(1)})
	eq("value", val(), "01/a1;1.1;w%401:tok")
	res = runOpsAt(t, a, "a2", 0, scriptOp{"r", "n", "tok", "10000;1.1;w%401"}, scriptOp{"r", "n", "other", "10000"})
	eq("re-entry", res[0], []any{int64(1), int64(1), int64(1), int64(0), int64(1)})
	eq("enter by another token", res[1].([]any)[0].(int64) < 0, true)
	eq("value after re-entry", val(), "01/a1,a2;1.1;w%401:tok")

	res = runOps(t, a, scriptOp{"r", "k", "tok", "3.5"}, scriptOp{"r", "k", "tok", "2.4"}, scriptOp{"r", "k", "other", "9.9"}, scriptOp{"r", "y", "tok", ""}, scriptOp{"r", "y", "other", ""})
	eq("sethold", res[:3], []any{int64(1), int64(1), int64(0)})
	eq("query", res[3], []any{int64(1), int64(3), int64(5), int64(0), int64(1)})
	eq("query by another token", res[4], int64(0))
	eq("value after sethold", val(), "01/a1,a2;3.5;w%401:tok")

	// Nothing deletes a counted holding on this node's count alone.
	res = runOps(t, a, scriptOp{"r", "up", "tok", "r"}, scriptOp{"r", "h", "tok", "1000:next"}, scriptOp{"r", "e", "tok", "20000"})
	eq("release of a counted holding", res[0], []any{int64(0), int64(3), int64(5), int64(0), int64(1)})
	eq("handoff of a counted holding", res[1], []any{int64(-1), int64(3), int64(5), int64(0), int64(1)})
	eq("extend of a counted holding", res[2], []any{int64(1), int64(3), int64(5), int64(0), int64(1), ";3.5;w%401"})
	res = runOpsAt(t, a, "a2", 0, scriptOp{"r", "c", "tok", "1000:r"}, scriptOp{"r", "f", "tok", "7"})
	eq("cleanup and raise", res, []any{int64(0), int64(1)})
	eq("value after cleanup and raise", val(), "07/a1;3.5;w%401:tok")

	res = runOps(t, a, scriptOp{"r", "v", "tok", ""}, scriptOp{"r", "v", "", ""}, scriptOp{"free", "v", "", ""})
	v := res[0].([]any)
	eq("view kind, header, mine", []any{v[0], v[2], v[3]}, []any{"exclusive", "07/a1;3.5;w%401", int64(1)})
	if p := v[1].(int64); p <= 0 || p > 20000 || len(v[4].(string)) != 40 || strings.Contains(v[4].(string), "tok") {
		t.Fatalf("view pttl %d owner %q", p, v[4])
	}
	eq("view without a token: mine", res[1].([]any)[3], int64(0))
	eq("view of a free lock", res[2], []any{"none", int64(-2), "", int64(0), ""})

	res = runOps(t, a, scriptOp{"r", "uf", "tok", "r"})
	eq("release of all holds", res[0], int64(1))
	eq("value after uf", val(), "")

	// Place and handoff carry an extension; a plain holding has none.
	res = runOpsAt(t, a, "a3", 0, scriptOp{"r", "p", "tok", "10000:9;2.6;"}, scriptOp{"s", "a", "tok", "10000"}, scriptOp{"s", "y", "tok", ""})
	eq("place with a count", res[0], int64(9))
	eq("placed value", val(), "09/a3;2.6;:tok")
	eq("query of a plain holding", res[2], []any{res[1], int64(1), int64(0), int64(0), res[1]})
	plain := res[2]
	res = runOps(t, a, scriptOp{"s", "ul", "tok", "s"}, scriptOp{"r", "ul", "tok", "r"})
	eq("release of the last hold of a holding without a count", res[0], []any{int64(0), int64(1), int64(0), int64(0), plain.([]any)[4]})
	eq("release of the last hold", res[1], int64(1))
	runOpsAt(t, a, "a4", 0, scriptOp{"s", "h", "tok", "10000;;w:next"})
	if got := a.Get(ctx, "lockproxy:lock:s").Val(); !strings.HasSuffix(got, "/a4;;w:next") {
		t.Fatalf("handed value %q, want the next token's with its extension", got)
	}
	// Extend reports a holder without a count too (healing carries it),
	// and a plain value as a bare fence.
	res = runOps(t, a, scriptOp{"s", "e", "next", "20000"}, scriptOp{"p", "a", "tok", "10000"}, scriptOp{"p", "e", "tok", "20000"})
	fence := res[0].([]any)[0]
	eq("extend of a holding with a holder", res[0], []any{fence, int64(0), int64(0), int64(0), fence, ";;w"})
	eq("extend of a plain holding", res[2], res[1])
}

// TestMergeKeepsLaterCount: recovery's merge of two readings of one
// holding keeps the hold count of the later version.
func TestMergeKeepsLaterCount(t *testing.T) {
	tests := []struct {
		a, b, want string
	}{
		{"01/a;2.3;h:tok", "02/b;3.4;:tok", "02/a,b;3.4;:tok"},
		{"03/a;5.7;h:tok", "02/b:tok", "03/a,b;5.7;h:tok"},
		{"01/a:tok", "01/b;;h:tok", "01/a,b;;h:tok"},
	}
	for _, tt := range tests {
		if got := merge(copied{value: tt.a, pttl: 10}, copied{value: tt.b, pttl: 20}); got.value != tt.want || got.pttl != 20 {
			t.Errorf("merge(%q, %q) = %+v, want %q", tt.a, tt.b, got, tt.want)
		}
	}
}
