package backend

import (
	"context"
	"errors"
	"testing"
)

// TestBackoff: a failed dial makes the next ones fail at once with its
// error until the wait passes; a success, a cancelled dial or an error
// Spare excuses ends or leaves the wait.
func TestBackoff(t *testing.T) {
	down := errors.New("connection refused")
	excused := errors.New("one user refused")
	b := Backoff{Spare: func(err error) bool { return errors.Is(err, excused) }}
	if err := b.Check(); err != nil {
		t.Fatalf("a new Backoff: %v", err)
	}
	b.Record(down)
	if err := b.Check(); !errors.Is(err, down) {
		t.Fatalf("after a failed dial: %v, want %v", err, down)
	}
	b.Record(excused)
	if err := b.Check(); !errors.Is(err, down) {
		t.Fatalf("after an excused error: %v, want %v still", err, down)
	}
	b.Record(context.Canceled)
	if err := b.Check(); err != nil {
		t.Fatalf("after a cancelled dial: %v", err)
	}
	b.Record(down)
	b.Record(nil)
	if err := b.Check(); err != nil {
		t.Fatalf("after a successful dial: %v", err)
	}
}

// TestSparesNil: no spares are kept for a size of 0, and a nil *Spares
// has none to give.
func TestSparesNil(t *testing.T) {
	sp := NewSpares(0, nil)
	if sp != nil || sp.Size() != 0 || sp.Take() != nil {
		t.Fatal("NewSpares(0) keeps spares")
	}
	sp.Start(context.Background())
	sp.Close(true)
}
