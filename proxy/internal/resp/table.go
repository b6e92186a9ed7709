package resp

import (
	"bytes"
	"strconv"
)

// The command table: everything the proxy needs to know about a Redis
// command, in one place. Two sources feed it:
//
//   - commands, below: the static overlay, what COMMAND does not say or
//     says differently from what the proxy needs (which commands move a
//     client off a shared connection, which wait, which are about the whole
//     server, how a cross-slot command is split, ...). It is known before
//     any backend answers, and read on every forwarded command.
//   - Table: the backend's own COMMAND reply, loaded once at first use:
//     where each command's keys are (KeySpec).
//
// Every question the proxy asks about a command (by its lower-case name,
// and for the commands with subcommands, CLIENT, CONFIG, ACL, ..., by its
// lower-case first argument) is asked here: Lookup, Of and Stateless for
// the overlay, LookupSpec for the backend's table.

// Flag is one fact about a command.
type Flag uint32

const (
	// Dedicated: the command sets or reads the connection's own state,
	// blocks, or stalls the connection for everyone (DEBUG, WAIT). It
	// never goes on a connection shared with other clients: the client
	// moves to a connection of its own.
	Dedicated Flag = 1 << iota
	// Blocking: the command may wait on the server.
	Blocking
	// Waits: the command waits for the connection's writes to reach the
	// replicas or the disk (WAIT, WAITAOF).
	Waits
	// Subscribes: a (un)subscribe command; Info.Family says which kind.
	Subscribes
	// EveryConn: the command sets connection state that every
	// connection of a cluster client carries and every new one replays
	// (AUTH, HELLO, CLIENT SETNAME, NO-EVICT, NO-TOUCH, TRACKING).
	EveryConn
	// NoSlot: the command is about the whole server or keyspace and is
	// routed by no slot in front of a cluster.
	NoSlot
	// Fanned: in front of a cluster the command goes to every master.
	Fanned
	// Splits: with keys in several slots the command is split per slot;
	// Info.Merge says how the replies merge.
	Splits
	// ChangesAccess: the command may change which connections the server
	// lets in (CONFIG only when an argument names requirepass).
	ChangesAccess
	// Wholesale: the command wipes, moves or copies every key (FLUSHALL,
	// FLUSHDB, SWAPDB, SYNC, PSYNC).
	Wholesale
	// NumKeys: the keys are the arguments after a count given as the
	// second argument (EVAL, FCALL and their forms), found without
	// asking the backend.
	NumKeys
	// Patterns: the command reads other keys by name patterns (SORT and
	// SORT_RO with BY or GET).
	Patterns
	// Script: the command runs a script or function, which may run past
	// busy-reply-threshold; then other clients get BUSY, and may end it
	// with SCRIPT KILL or FUNCTION KILL. In front of a cluster it goes
	// on the client's own connection: on a shared one it would hold back
	// every other client's commands behind it.
	Script
)

// Merge is how the replies of a split command's parts become one.
type Merge uint8

const (
	MergeFirst  Merge = iota // the first error, else the first part's reply
	MergeArray               // MGET: the elements, put back in the client's order
	MergeSum                 // DEL, EXISTS, ...: the sum of the integers
	MergeConcat              // KEYS: all the elements
	MergeLast                // the last part's reply; an error before it fails the transaction
)

// Effect is what a command does to the state of the connection it is
// sent on, beyond its reply: the proxy matches its reply, learns the
// state from it, and replays that state on a new connection.
type Effect uint8

// The effects, by Info.Effect.
const (
	NoEffect          Effect = iota // the command changes nothing on its connection
	EffectSubscribe                 // SUBSCRIBE, PSUBSCRIBE, SSUBSCRIBE: Info.Family says which kind
	EffectUnsubscribe               // their UNSUBSCRIBE
	EffectSelect                    // SELECT
	EffectAuth                      // AUTH
	EffectHello                     // HELLO
	EffectSetName                   // CLIENT SETNAME
	EffectNoEvict                   // CLIENT NO-EVICT
	EffectNoTouch                   // CLIENT NO-TOUCH
	EffectTracking                  // CLIENT TRACKING
	EffectReplyMode                 // CLIENT REPLY
	EffectMonitor                   // MONITOR
	EffectSync                      // SYNC, PSYNC: the replication stream answers
	EffectReset                     // RESET
	EffectQuit                      // QUIT
	EffectMulti                     // MULTI
	EffectExec                      // EXEC
	EffectDiscard                   // DISCARD
	EffectWatch                     // WATCH
	EffectUnwatch                   // UNWATCH
	// EffectClientID: CLIENT ID, whose reply is the connection's
	// identity; EffectKill: CLIENT KILL, which may end another client's
	// (KillID). The proxy learns which client an id is.
	EffectClientID
	EffectKill
)

// Pub/sub families: channels, patterns, shard channels.
const (
	FamChannel uint8 = iota
	FamPattern
	FamShard
)

// Info is what the proxy knows of a command before asking the backend.
type Info struct {
	Flags  Flag
	Merge  Merge // with Splits
	Family uint8 // with Subscribes
	Effect Effect
	// Sub holds the facts of subcommands that differ from the command's
	// own, by lower-case first argument.
	Sub map[string]Info
}

// Has reports whether every flag of f is set.
func (i Info) Has(f Flag) bool { return i.Flags&f == f }

// commands is the static overlay, by lower-case name.
var commands = map[string]Info{
	// Connection state.
	"select":    {Flags: Dedicated, Effect: EffectSelect},
	"auth":      {Flags: Dedicated | EveryConn, Effect: EffectAuth},
	"hello":     {Flags: Dedicated | EveryConn, Effect: EffectHello},
	"reset":     {Flags: Dedicated, Effect: EffectReset},
	"quit":      {Flags: Dedicated, Effect: EffectQuit},
	"readonly":  {Flags: Dedicated | NoSlot},
	"readwrite": {Flags: Dedicated | NoSlot},
	"asking":    {Flags: Dedicated},
	"client": {Flags: Dedicated | NoSlot, Sub: map[string]Info{
		"setname":  {Flags: EveryConn, Effect: EffectSetName},
		"no-evict": {Flags: EveryConn, Effect: EffectNoEvict},
		"no-touch": {Flags: EveryConn, Effect: EffectNoTouch},
		"tracking": {Flags: EveryConn, Effect: EffectTracking},
		"reply":    {Effect: EffectReplyMode},
		"id":       {Effect: EffectClientID},
		"kill":     {Effect: EffectKill},
		"pause":    {Flags: Fanned},
		"unpause":  {Flags: Fanned},
	}},

	// Transactions.
	"multi":   {Flags: Dedicated, Effect: EffectMulti},
	"exec":    {Flags: Dedicated, Effect: EffectExec},
	"discard": {Flags: Dedicated, Effect: EffectDiscard},
	"watch":   {Flags: Dedicated, Effect: EffectWatch},
	"unwatch": {Flags: Dedicated, Effect: EffectUnwatch},

	// Pub/sub and MONITOR.
	"subscribe":    {Flags: Dedicated | Subscribes, Family: FamChannel, Effect: EffectSubscribe},
	"unsubscribe":  {Flags: Dedicated | Subscribes, Family: FamChannel, Effect: EffectUnsubscribe},
	"psubscribe":   {Flags: Dedicated | Subscribes, Family: FamPattern, Effect: EffectSubscribe},
	"punsubscribe": {Flags: Dedicated | Subscribes, Family: FamPattern, Effect: EffectUnsubscribe},
	"ssubscribe":   {Flags: Dedicated | Subscribes, Family: FamShard, Effect: EffectSubscribe},
	"sunsubscribe": {Flags: Dedicated | Subscribes, Family: FamShard, Effect: EffectUnsubscribe},
	"monitor":      {Flags: Dedicated, Effect: EffectMonitor},
	"pubsub": {Flags: NoSlot, Sub: map[string]Info{
		"shardchannels": {Flags: Fanned},
		"shardnumsub":   {Flags: Fanned},
	}},

	// Replication.
	"sync":     {Flags: Dedicated | Wholesale, Effect: EffectSync},
	"psync":    {Flags: Dedicated | Wholesale, Effect: EffectSync},
	"replconf": {Flags: Dedicated},
	"wait":     {Flags: Dedicated | Blocking | Waits | NoSlot},
	"waitaof":  {Flags: Dedicated | Blocking | Waits | NoSlot},

	// Blocking.
	"blpop":      {Flags: Dedicated | Blocking},
	"brpop":      {Flags: Dedicated | Blocking},
	"brpoplpush": {Flags: Dedicated | Blocking},
	"blmove":     {Flags: Dedicated | Blocking},
	"blmpop":     {Flags: Dedicated | Blocking},
	"bzpopmin":   {Flags: Dedicated | Blocking},
	"bzpopmax":   {Flags: Dedicated | Blocking},
	"bzmpop":     {Flags: Dedicated | Blocking},
	"xread":      {Flags: Dedicated | Blocking},
	"xreadgroup": {Flags: Dedicated | Blocking},

	// The server.
	"debug":        {Flags: Dedicated},
	"shutdown":     {Flags: Dedicated},
	"failover":     {Flags: Dedicated},
	"info":         {Flags: NoSlot | Fanned},
	"save":         {Flags: NoSlot | Fanned},
	"bgsave":       {Flags: NoSlot | Fanned},
	"bgrewriteaof": {Flags: NoSlot | Fanned},
	"config": {Flags: NoSlot | ChangesAccess, Sub: map[string]Info{
		"set":       {Flags: Fanned},
		"resetstat": {Flags: Fanned},
		"rewrite":   {Flags: Fanned},
	}},
	"acl": {Flags: NoSlot, Sub: map[string]Info{
		"setuser": {Flags: Fanned | ChangesAccess},
		"deluser": {Flags: Fanned | ChangesAccess},
		"load":    {Flags: Fanned | ChangesAccess},
		"save":    {Flags: Fanned},
		"log":     {Flags: Fanned},
	}},
	"script": {Flags: NoSlot, Sub: map[string]Info{
		"exists": {Flags: Fanned},
		"kill":   {Flags: Fanned},
		"load":   {Flags: Fanned},
		"flush":  {Flags: Fanned},
	}},
	"function": {Flags: NoSlot, Sub: map[string]Info{
		"kill":    {Flags: Fanned},
		"load":    {Flags: Fanned},
		"delete":  {Flags: Fanned},
		"flush":   {Flags: Fanned},
		"restore": {Flags: Fanned},
	}},
	"latency": {Flags: NoSlot, Sub: map[string]Info{
		"reset":     {Flags: Fanned},
		"histogram": {Flags: Fanned},
		"latest":    {Flags: Fanned},
		"history":   {Flags: Fanned},
	}},
	"slowlog": {Flags: NoSlot, Sub: map[string]Info{
		"reset": {Flags: Fanned},
		"len":   {Flags: Fanned},
		"get":   {Flags: Fanned},
	}},

	// The keyspace.
	"dbsize":    {Flags: NoSlot | Fanned},
	"keys":      {Flags: NoSlot | Fanned},
	"flushall":  {Flags: NoSlot | Fanned | Wholesale},
	"flushdb":   {Flags: NoSlot | Fanned | Wholesale},
	"swapdb":    {Flags: Wholesale},
	"scan":      {Flags: NoSlot},
	"randomkey": {Flags: NoSlot},

	// Keys.
	"mget":       {Flags: Splits, Merge: MergeArray},
	"mset":       {Flags: Splits, Merge: MergeFirst},
	"del":        {Flags: Splits, Merge: MergeSum},
	"unlink":     {Flags: Splits, Merge: MergeSum},
	"exists":     {Flags: Splits, Merge: MergeSum},
	"touch":      {Flags: Splits, Merge: MergeSum},
	"eval":       {Flags: NumKeys | Script},
	"evalsha":    {Flags: NumKeys | Script},
	"eval_ro":    {Flags: NumKeys | Script},
	"evalsha_ro": {Flags: NumKeys | Script},
	"fcall":      {Flags: NumKeys | Script},
	"fcall_ro":   {Flags: NumKeys | Script},
	"sort":       {Flags: Patterns},
	"sort_ro":    {Flags: Patterns},
}

// named is one command of the overlay, in index.
type named struct {
	name string
	info *Info
}

// index finds the overlay's commands by length and first letter: every
// forwarded command asks the overlay, and most are in no entry, which
// this tells with a comparison or two, where a map would hash the name.
var index = func() (x [maxName + 1]['z' - 'a' + 1][]named) {
	for name := range commands {
		i := commands[name]
		x[len(name)][name[0]-'a'] = append(x[len(name)][name[0]-'a'], named{name, &i})
	}
	return x
}()

// maxName is the longest name in the overlay.
const maxName = 12

// find returns the overlay's entry for name (lower case), or nil.
func find(name []byte) *Info {
	if len(name) == 0 || len(name) > maxName || name[0] < 'a' || name[0] > 'z' {
		return nil
	}
	for _, e := range index[len(name)][name[0]-'a'] {
		if e.name == string(name) {
			return e.info
		}
	}
	return nil
}

// Lookup returns what the proxy knows of the command name (lower case).
// A command it knows nothing special about has no flags.
func Lookup(name []byte) Info {
	if i := find(name); i != nil {
		return *i
	}
	return Info{}
}

// Stateless reports whether a command may share a backend connection
// with other clients: it neither changes nor reads the connection's own
// state, and it never blocks.
func Stateless(name []byte) bool {
	i := find(name)
	return name != nil && (i == nil || i.Flags&Dedicated == 0)
}

// Plain reports whether a command may share a backend connection
// (Stateless) and does nothing to its connection's state that the proxy
// follows (Affects): a command whose reply is all there is to it.
func Plain(name []byte) bool {
	i := find(name)
	return name != nil && (i == nil || i.Flags&Dedicated == 0 && i.Effect == NoEffect && i.Sub == nil)
}

// Lower writes the ASCII lower case of b into buf and returns it, or
// returns nil when b does not fit: no command name is that long.
func Lower(buf *[24]byte, b []byte) []byte {
	if len(b) > len(buf) {
		return nil
	}
	for i, c := range b {
		if c >= 'A' && c <= 'Z' {
			c += 'a' - 'A'
		}
		buf[i] = c
	}
	return buf[:len(b)]
}

// Affects reports whether the command name may change its connection's
// state (EffectOf tells how): a check cheap enough for every command,
// which most fail.
func Affects(name []byte) bool {
	i := find(name)
	return i != nil && (i.Effect != NoEffect || i.Sub != nil)
}

// EffectOf returns what a command with its arguments does to its
// connection, and its pub/sub family: Of(name, args).Effect and .Family,
// without copying the rest.
func EffectOf(name []byte, args [][]byte) (Effect, uint8) {
	i := find(name)
	if i == nil {
		return NoEffect, 0
	}
	if i.Sub != nil && len(args) > 1 {
		var sb [24]byte
		if s := i.Sub[string(Lower(&sb, args[1]))]; s.Effect != NoEffect {
			return s.Effect, i.Family
		}
	}
	return i.Effect, i.Family
}

// Of returns the facts of a command with its arguments: the command's,
// with those of its subcommand (args[1], in any case) added, and the
// subcommand's Effect.
func Of(name []byte, args [][]byte) Info {
	i := Lookup(name)
	if i.Sub != nil && len(args) > 1 {
		var sb [24]byte
		s := i.Sub[string(Lower(&sb, args[1]))]
		i.Flags |= s.Flags
		if s.Effect != NoEffect {
			i.Effect = s.Effect
		}
	}
	return i
}

// KillID returns the id of a CLIENT KILL's ID filter (the last one, as
// Redis takes it); ok is false without one, for an id that is not a
// number (Redis's error), and for the old form, CLIENT KILL addr:port.
func KillID(args [][]byte) (id int64, ok bool) {
	if len(args) < 4 {
		return 0, false
	}
	for i := 2; i+1 < len(args); i += 2 {
		if bytes.EqualFold(args[i], []byte("id")) {
			n, err := strconv.ParseInt(string(args[i+1]), 10, 64)
			if err != nil {
				return 0, false
			}
			id, ok = n, true
		}
	}
	return id, ok
}
