package cluster

import (
	"context"
	"errors"
	"fmt"
	"net"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/lockproxy/lockproxy/proxy/internal/resp"
)

// numSlots is Redis Cluster's number of hash slots.
const NumSlots = 16384

// noSlot is the slot of a command without keys.
const NoSlot = -1

// slotMap is one reading of the cluster's topology: which master serves
// each slot. It is never changed once stored; a refresh replaces it whole.
type SlotMap struct {
	Masters []string         // addresses, in the order of their first slot
	First   []int            // each master's first slot
	owner   [NumSlots]uint16 // index into masters; unowned when >= len(masters)
	Gen     uint64           // the reading that made it (router.gen)
}

// master returns the address of the master serving slot, or "".
func (m *SlotMap) Master(slot int) string {
	if i := int(m.owner[slot]); i < len(m.Masters) {
		return m.Masters[i]
	}
	return ""
}

// clusterRouter is what the proxy knows of a Redis Cluster behind it: the slot
// map, the COMMAND table (where each command's keys are) and the counters
// of redirections. Its methods are safe for concurrent use.
type Router struct {
	cfg RouterConfig

	Slots atomic.Pointer[SlotMap]
	// refresh serialises reading the slot map; gen counts the readings, so
	// that clients that saw the same MOVED wait for one reading.
	refresh sync.Mutex
	Gen     atomic.Uint64
	last    time.Time // of the last reading; under refresh

	table resp.Table
	// intsetMax is the masters' set-max-intset-entries, 0 until read
	// (join.go).
	intsetMax atomic.Int64
	// pausedUntil is when the last CLIENT PAUSE sent through the proxy
	// ends (unix nanoseconds), 0 when none is in effect (pause.go).
	pausedUntil atomic.Int64
	// slowlogMax is 1 + slowlog-max-len as last set through the proxy,
	// 0 until then (slowlog.go).
	slowlogMax atomic.Int64

	mu      sync.Mutex
	control map[string]*redis.Client // per node, for CLUSTER SHARDS, COMMAND and COMMAND GETKEYS

	Refreshes, Moved, Asked atomic.Uint64
	PerMaster               sync.Map // address -> *atomic.Uint64, commands forwarded
}

// RouterConfig is how a router reaches the cluster.
type RouterConfig struct {
	// Seeds are the nodes asked first, until a slot map names the masters.
	Seeds []string
	// Timeout bounds each reading of the slot map and of the masters'
	// configuration.
	Timeout time.Duration
	// TLS: the nodes are reached at their TLS ports.
	TLS bool
	// Options are the control connection's options to the node at addr.
	Options func(addr string) *redis.Options
	// Masters, when set, is told the masters of every slot map read
	// (the proxy keeps spare connections to each).
	Masters func(masters []string)
}

// NewRouter returns the router of the cluster cfg reaches.
func NewRouter(cfg RouterConfig) *Router {
	return &Router{cfg: cfg, control: map[string]*redis.Client{}}
}

func (r *Router) Close() {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, c := range r.control {
		c.Close()
	}
}

// client returns the control client of the node at addr.
func (r *Router) client(addr string) *redis.Client {
	r.mu.Lock()
	defer r.mu.Unlock()
	if c := r.control[addr]; c != nil {
		return c
	}
	c := redis.NewClient(r.cfg.Options(addr))
	r.control[addr] = c
	return c
}

// candidates are the nodes to ask about the cluster: the known masters,
// then the seeds.
func (r *Router) Candidates() []string {
	var out []string
	if m := r.Slots.Load(); m != nil {
		out = append(out, m.Masters...)
	}
	return append(out, r.cfg.Seeds...)
}

// errNoNode reports that no node of the cluster answered.
var ErrNoNode = errors.New("no cluster node answered")

// do runs one control command on the first node that answers.
func (r *Router) do(ctx context.Context, args ...any) (any, error) {
	var errs []error
	for _, addr := range r.Candidates() {
		v, err := r.client(addr).Do(ctx, args...).Result()
		var rerr redis.Error
		if err == nil || errors.As(err, &rerr) {
			return v, err
		}
		errs = append(errs, fmt.Errorf("%s: %w", addr, err))
	}
	return nil, fmt.Errorf("%w: %w", ErrNoNode, errors.Join(errs...))
}

// current returns the slot map, reading it first if there is none yet.
func (r *Router) Current(ctx context.Context) (*SlotMap, error) {
	if m := r.Slots.Load(); m != nil {
		return m, nil
	}
	if err := r.Reload(ctx, r.Gen.Load()); err != nil {
		return nil, err
	}
	return r.Slots.Load(), nil
}

// reload reads the slot map again, unless it was read since the reading
// seen was gen (another client's refresh already brought it in).
func (r *Router) Reload(ctx context.Context, seen uint64) error {
	r.refresh.Lock()
	defer r.refresh.Unlock()
	if r.Gen.Load() != seen && r.Slots.Load() != nil {
		return nil
	}
	if time.Since(r.last) < 10*time.Millisecond {
		return nil // many clients asking at once: one reading is enough
	}
	r.last = time.Now()
	ctx, cancel := context.WithTimeout(ctx, r.cfg.Timeout)
	defer cancel()
	var errs []error
	for _, addr := range r.Candidates() {
		shards, err := r.client(addr).ClusterShards(ctx).Result()
		if err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", addr, err))
			continue
		}
		type owned struct {
			start, end int64
			addr       string
		}
		var ranges []owned
		for _, sh := range shards {
			master := ""
			for _, n := range sh.Nodes {
				if n.Role == "master" && n.Health != "fail" {
					port := n.Port
					if r.cfg.TLS && n.TLSPort != 0 {
						port = n.TLSPort
					}
					ip := n.IP
					if ip == "" || ip == "?" {
						ip = n.Endpoint
					}
					master = net.JoinHostPort(ip, strconv.FormatInt(port, 10))
				}
			}
			for _, sr := range sh.Slots {
				if master != "" && sr.Start >= 0 && sr.End < NumSlots && sr.Start <= sr.End {
					ranges = append(ranges, owned{sr.Start, sr.End, master})
				}
			}
		}
		sort.Slice(ranges, func(i, j int) bool { return ranges[i].start < ranges[j].start })
		m := &SlotMap{}
		for i := range m.owner {
			m.owner[i] = 0xFFFF
		}
		index := map[string]uint16{}
		for _, o := range ranges {
			i, ok := index[o.addr]
			if !ok {
				i = uint16(len(m.Masters))
				index[o.addr] = i
				m.Masters = append(m.Masters, o.addr)
				m.First = append(m.First, int(o.start))
			}
			for sl := o.start; sl <= o.end; sl++ {
				m.owner[sl] = i
			}
		}
		if len(m.Masters) == 0 {
			errs = append(errs, fmt.Errorf("%s: no slots assigned", addr))
			continue
		}
		m.Gen = r.Gen.Load() + 1 // readings are serialised by refresh
		r.Slots.Store(m)
		if r.cfg.Masters != nil {
			r.cfg.Masters(m.Masters)
		}
		r.Gen.Add(1)
		r.Refreshes.Add(1)
		return nil
	}
	return fmt.Errorf("cluster shards: %w", errors.Join(errs...))
}

// counter returns the count of commands sent to the master at addr.
func (r *Router) Counter(addr string) *atomic.Uint64 {
	v, ok := r.PerMaster.Load(addr)
	if !ok {
		v, _ = r.PerMaster.LoadOrStore(addr, new(atomic.Uint64))
	}
	return v.(*atomic.Uint64)
}

// Table is the COMMAND table, loaded or not.
func (r *Router) Table() *resp.Table { return &r.table }

// Commands returns the cluster's COMMAND table, loading it at first use.
func (r *Router) Commands(ctx context.Context) (map[string]resp.KeySpec, error) {
	return r.table.Get(ctx, func(ctx context.Context) (any, error) { return r.do(ctx, "COMMAND") })
}

// keys appends the keys of a command to dst, as Redis finds them: the
// positions of the COMMAND table, or COMMAND GETKEYS for commands whose keys
// move. EVAL, EVALSHA, FCALL and their read-only forms are read here
// without a round trip. A command Redis does not know, or whose arguments
// it would refuse, has no keys: Redis answers it with its error.
func (r *Router) Keys(ctx context.Context, dst [][]byte, name []byte, args [][]byte) ([][]byte, error) {
	if resp.Lookup(name).Has(resp.NumKeys) {
		if len(args) < 3 {
			return dst, nil
		}
		n, err := strconv.Atoi(string(args[2]))
		if err != nil || n < 0 || n > len(args)-3 {
			return dst, nil
		}
		return append(dst, args[3:3+n]...), nil
	}
	table, err := r.Commands(ctx)
	if err != nil {
		return dst, err
	}
	spec, ok := resp.LookupSpec(table, name, args)
	if !ok {
		return dst, nil
	}
	if keys, ok := resp.MovableKeys(name, args); ok {
		return append(dst, keys...), nil
	}
	if spec.Movable {
		q := make([]any, 0, len(args)+2)
		q = append(q, "COMMAND", "GETKEYS")
		for _, a := range args {
			q = append(q, a)
		}
		v, err := r.do(ctx, q...)
		var rerr redis.Error
		if errors.As(err, &rerr) {
			return dst, nil
		}
		if err != nil {
			return dst, err
		}
		list, _ := v.([]any)
		for _, k := range list {
			if s, ok := k.(string); ok {
				dst = append(dst, []byte(s))
			}
		}
		return dst, nil
	}
	return spec.Keys(dst, args), nil
}

// keySlot is Redis Cluster's hash slot of a key: CRC16 (XMODEM) of the key,
// or of the part between the first "{" and the next "}" when that part is
// not empty, modulo 16384.
func KeySlot(key []byte) int {
	for i, c := range key {
		if c == '{' {
			for j := i + 1; j < len(key); j++ {
				if key[j] == '}' {
					if j > i+1 {
						key = key[i+1 : j]
					}
					return int(crc16(key)) & (NumSlots - 1)
				}
			}
			break
		}
	}
	return int(crc16(key)) & (NumSlots - 1)
}

var crcTable = func() (t [256]uint16) {
	for i := range t {
		crc := uint16(i) << 8
		for range 8 {
			if crc&0x8000 != 0 {
				crc = crc<<1 ^ 0x1021
			} else {
				crc <<= 1
			}
		}
		t[i] = crc
	}
	return t
}()

// crc16 is CRC-16/XMODEM, the checksum of Redis Cluster's key hashing.
func crc16(b []byte) uint16 {
	var crc uint16
	for _, c := range b {
		crc = crc<<8 ^ crcTable[byte(crc>>8)^c]
	}
	return crc
}

// clusterInfo is the part of INFO lockproxy about the cluster.
func (r *Router) Info() string {
	var b strings.Builder
	fmt.Fprintf(&b, "cluster_slot_map_refreshes:%d\r\ncluster_moved:%d\r\ncluster_ask:%d\r\n",
		r.Refreshes.Load(), r.Moved.Load(), r.Asked.Load())
	if m := r.Slots.Load(); m != nil {
		for i, a := range m.Masters {
			fmt.Fprintf(&b, "cluster_master%d:addr=%s,forwarded=%d\r\n", i, a, r.count(a))
		}
	}
	return b.String()
}

func (r *Router) count(addr string) uint64 {
	if v, ok := r.PerMaster.Load(addr); ok {
		return v.(*atomic.Uint64).Load()
	}
	return 0
}

// served counts the slots with a master.
func (m *SlotMap) served() int {
	n := 0
	for _, o := range &m.owner { // not a 32 KB copy on the stack
		if int(o) < len(m.Masters) {
			n++
		}
	}
	return n
}

// ready reads the slot map and checks that every master answers PING.
func (r *Router) Ready(ctx context.Context) error {
	if err := r.Reload(ctx, r.Gen.Load()); err != nil {
		return err
	}
	m := r.Slots.Load()
	if n := m.served(); n < NumSlots {
		return fmt.Errorf("%d of %d slots have no master", NumSlots-n, NumSlots)
	}
	for _, a := range m.Masters {
		if err := r.client(a).Ping(ctx).Err(); err != nil {
			return fmt.Errorf("%s: %w", a, err)
		}
	}
	return nil
}
