// Package lockspage serves the operators' page of the lock state on the
// metrics listener: /locks, a plain HTML page (with its script and style,
// embedded in the binary: no build step, nothing fetched from elsewhere),
// and /locks.json, the data it reads again 200 ms after each read: every
// resource held on a majority of the lock nodes, a page at a time by LOCKS's cursor,
// with what LOCKINFO reports of it, and the state and round-trip time of
// every lock node. Neither ever holds a token: quorum.Info has none.
package lockspage

import (
	"context"
	"embed"
	"encoding/json"
	"errors"
	"io/fs"
	"net/http"
	"slices"
	"strconv"
	"time"

	"github.com/lockproxy/lockproxy/quorum"
)

//go:embed static
var static embed.FS

// Page sizes of /locks.json: the default, the largest, and the most
// LOCKS steps one request runs to fill a page (each bounded like a LOCKS
// call), so that a request stays quick on nodes with many other keys.
const (
	defaultCount = 100
	maxCount     = 1000
	maxSteps     = 64
)

// Lock is one row of /locks.json: a held resource and LOCKINFO's fields
// of it (no token, ever).
type Lock struct {
	Resource string `json:"resource"`
	Mode     string `json:"mode"`
	Holders  int64  `json:"holders"`
	Holder   string `json:"holder"`
	Fence    int64  `json:"fence"`
	// ValidityMS is the validity when the page was read, -1 when none.
	ValidityMS int64 `json:"validity_ms"`
	Holds      int64 `json:"holds"`
	Permits    int64 `json:"permits"`
	Waiters    int   `json:"waiters"`
}

// Node is one lock node's row of /locks.json.
type Node struct {
	Index int    `json:"index"`
	Addr  string `json:"addr"`
	// State is "up", "down", "recovering" (lost its data), "clock suspect"
	// (its clock jumped forward: recovering too) or "evicting".
	State  string `json:"state"`
	Reason string `json:"reason,omitempty"`
	// Until is, while recovering, when it counts again at the latest.
	Until string `json:"until,omitempty"`
	// RTTMS is the round trip of its recent calls, in ms; -1 before any.
	RTTMS float64 `json:"rtt_ms"`
}

// Snapshot is the body of /locks.json.
type Snapshot struct {
	Proxy string `json:"proxy"`
	Time  string `json:"time"`
	Match string `json:"match"`
	// Cursor is the page's cursor, Next the next page's ("0": this is
	// the last page).
	Cursor string `json:"cursor"`
	Next   string `json:"next"`
	Locks  []Lock `json:"locks"`
	Nodes  []Node `json:"nodes"`
	// Error says why the locks could not be listed (for example
	// "NOQUORUM 1 of 3 lock nodes answered"); the nodes are still shown.
	Error string `json:"error,omitempty"`
}

// Handler serves /locks, /locks/ (the script and style) and /locks.json.
type Handler struct {
	locker  *quorum.Locker
	proxyID string
	files   http.Handler
}

// New returns the page's Handler for locker, naming the proxy by proxyID
// (INFO lockproxy's proxy_id).
func New(locker *quorum.Locker, proxyID string) *Handler {
	sub, err := fs.Sub(static, "static")
	if err != nil {
		panic(err) // the embedded tree always has it
	}
	return &Handler{locker: locker, proxyID: proxyID, files: http.StripPrefix("/locks/", http.FileServerFS(sub))}
}

// Register adds the page's routes to mux.
func (h *Handler) Register(mux *http.ServeMux) {
	mux.HandleFunc("GET /locks", h.page)
	mux.Handle("GET /locks/", h.assets())
	mux.HandleFunc("GET /locks.json", h.json)
}

// headers are set on every response: nothing is cached (the state is
// live), nothing is loaded from elsewhere, and no other site may frame
// the page.
func headers(w http.ResponseWriter) {
	w.Header().Set("Cache-Control", "no-store")
	w.Header().Set("Content-Security-Policy", "default-src 'self'; frame-ancestors 'none'")
	w.Header().Set("X-Content-Type-Options", "nosniff")
}

func (h *Handler) page(w http.ResponseWriter, r *http.Request) {
	b, err := static.ReadFile("static/index.html")
	if err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	headers(w)
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.Write(b)
}

func (h *Handler) assets() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		headers(w)
		h.files.ServeHTTP(w, r)
	})
}

func (h *Handler) json(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	var cursor uint64
	var err error
	if s := q.Get("cursor"); s != "" {
		if cursor, err = strconv.ParseUint(s, 10, 64); err != nil {
			http.Error(w, "invalid cursor", http.StatusBadRequest)
			return
		}
	}
	count := defaultCount
	if s := q.Get("count"); s != "" {
		if count, err = strconv.Atoi(s); err != nil || count < 1 {
			http.Error(w, "count must be a positive integer", http.StatusBadRequest)
			return
		}
		count = min(count, maxCount)
	}
	match := q.Get("match")
	if match == "" {
		match = "*"
	}
	ctx, cancel := context.WithTimeout(r.Context(), 5*time.Second)
	defer cancel()
	snap := h.Snapshot(ctx, cursor, match, count)
	headers(w)
	w.Header().Set("Content-Type", "application/json")
	if snap.Error == "invalid cursor" {
		w.WriteHeader(http.StatusBadRequest)
	}
	enc := json.NewEncoder(w)
	enc.SetIndent("", " ")
	enc.Encode(snap)
}

// Snapshot reads one page of the lock state: from cursor, the held
// resources matching the glob match, by LOCKS steps whose COUNT is what
// the page still lacks, until count of them (a step may add a few more:
// the cursor has gone past them), the end of the iteration, or maxSteps
// steps; sorted by name; and the nodes' states.
func (h *Handler) Snapshot(ctx context.Context, cursor uint64, match string, count int) Snapshot {
	snap := Snapshot{
		Proxy:  h.proxyID,
		Time:   time.Now().UTC().Format(time.RFC3339Nano),
		Match:  match,
		Cursor: strconv.FormatUint(cursor, 10),
		Next:   "0",
		Locks:  []Lock{},
	}
	seen := make(map[string]bool)
	next := cursor
	for step := 0; step < maxSteps && len(snap.Locks) < count; step++ {
		var found []quorum.Listed
		var err error
		next, found, err = h.locker.LocksOnce(ctx, next, match, max(count-len(snap.Locks), 10))
		if err != nil {
			snap.Error = errText(err)
			next = cursor // read this page again
			break
		}
		for _, f := range found {
			if seen[f.Resource] {
				continue
			}
			seen[f.Resource] = true
			snap.Locks = append(snap.Locks, lockOf(f))
		}
		if next == 0 {
			break
		}
	}
	snap.Next = strconv.FormatUint(next, 10)
	slices.SortFunc(snap.Locks, func(a, b Lock) int {
		switch {
		case a.Resource < b.Resource:
			return -1
		case a.Resource > b.Resource:
			return 1
		}
		return 0
	})
	for _, n := range h.locker.NodeViews() {
		node := Node{Index: n.Index, Addr: n.Addr, State: string(n.State), Reason: n.Reason, RTTMS: -1}
		if n.ClockSuspect {
			node.State = "clock suspect"
		}
		if !n.Until.IsZero() {
			node.Until = n.Until.UTC().Format(time.RFC3339)
		}
		if n.RTT > 0 {
			node.RTTMS = float64(n.RTT.Microseconds()) / 1000
		}
		snap.Nodes = append(snap.Nodes, node)
	}
	return snap
}

func lockOf(f quorum.Listed) Lock {
	in := f.Info
	v := int64(-1)
	if in.Validity >= 0 {
		v = in.Validity.Milliseconds()
	}
	return Lock{
		Resource: f.Resource, Mode: in.Mode, Holders: in.Holders, Holder: in.Holder,
		Fence: in.Fence, ValidityMS: v, Holds: in.Holds, Permits: in.Permits, Waiters: in.Waiters,
	}
}

// errText is the short text of an error from Locks, as LOCKS replies it.
func errText(err error) string {
	var nq *quorum.NoQuorumError
	switch {
	case errors.As(err, &nq):
		return "NOQUORUM " + nq.Reply()
	case errors.Is(err, quorum.ErrInvalidCursor):
		return "invalid cursor"
	case errors.Is(err, context.DeadlineExceeded), errors.Is(err, context.Canceled):
		return "the lock nodes did not answer in time"
	}
	return "the lock nodes could not be read"
}
