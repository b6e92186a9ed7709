package clientid

import "testing"

func TestRegistry(t *testing.T) {
	type client struct{ name string }
	a, b := &client{"a"}, &client{"b"}
	var r Registry[*client]
	var ha, hb Held[*client]
	r.Add(&ha, 1, a)
	r.Add(&ha, 1, a) // asked again on the same connection
	r.Add(&ha, 2, a)
	r.Add(&hb, 2, b) // the server gave 2 again, to b's connection
	if c, ok := r.Load(1); !ok || c != a {
		t.Fatalf("Load(1) = %v, %v, want a", c, ok)
	}
	r.Forget(&ha)
	if _, ok := r.Load(1); ok {
		t.Error("1 is still registered after a went")
	}
	if c, ok := r.Load(2); !ok || c != b {
		t.Errorf("Load(2) = %v, %v after a went, want b's", c, ok)
	}
	r.Forget(&hb)
	if _, ok := r.Load(2); ok {
		t.Error("2 is still registered after b went")
	}
	r.Forget(&hb) // twice: nothing left
}
