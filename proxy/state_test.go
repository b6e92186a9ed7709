package proxy

import (
	"bufio"
	"fmt"
	"io"
	"strings"
	"testing"

	"github.com/tidwall/redcon"

	"github.com/lockproxy/lockproxy/proxy/internal/resp"
)

// event is one event of a connection: a command sent, a reply frame
// arriving, the connection lost, or one of the proxy's own doings.
type event struct {
	send   string // a command sent to the backend, arguments split on spaces
	reply  string // a reply frame from the backend, raw RESP
	lose   bool   // the backend connection is lost
	refuse bool   // the proxy refuses a command of the client
	local  bool   // the proxy answers a command itself
	own    bool   // the proxy sends a command of its own (AUTH after RESET)
	unsent string // a command that could not be sent: no backend connection
}

func tx(cmd string) event     { return event{send: cmd} }
func rx(frame string) event   { return event{reply: frame} }
func unsent(cmd string) event { return event{unsent: cmd} }

var (
	lose   = event{lose: true}
	refuse = event{refuse: true}
	local  = event{local: true}
	own    = event{own: true}
)

// play runs events through a connState as the reply queue does, and
// returns one word per event: for a command sent (the client's or the
// proxy's own), "r" when a reply is owed, "-" when none is, "X" when it is
// an EXEC the proxy aborts; for a reply, its outcome (u unsolicited,
// c confirming, C confirmed, a answered, q QUIT answered); for a loss "l",
// or "L" when the client was listening; for a local command "s" when its
// reply is suppressed, else "r". The second result describes the state at
// the end.
func play(t *testing.T, events []event) (trace, state string) {
	t.Helper()
	c := newConnState()
	var fifo []entry
	var words []string
	for _, st := range events {
		switch {
		case st.unsent != "":
			cmd, _ := redcon.Parse(command(strings.Split(st.unsent, " ")...))
			var nb [24]byte
			e := classify(resp.Lower(&nb, cmd.Args[0]), cmd)
			c.unsent(&e)
			words = append(words, "u")
		case st.send != "" || st.own:
			e := entry{kind: entryInternal}
			if !st.own {
				cmd, err := redcon.Parse(command(strings.Split(st.send, " ")...))
				if err != nil {
					t.Fatalf("parse %q: %v", st.send, err)
				}
				var nb [24]byte
				e = classify(resp.Lower(&nb, cmd.Args[0]), cmd)
			}
			if reply := c.doomed(&e); reply != nil {
				words = append(words, doomedWords[string(reply)])
				break
			}
			w := "-"
			if c.sent(&e) {
				fifo = append(fifo, e)
				w = "r"
			}
			if e.replace != nil {
				w = replacedWords[string(e.replace)]
			}
			words = append(words, w)
		case st.reply != "":
			var ri resp.ReplyInfo
			r := bufio.NewReader(strings.NewReader(st.reply))
			if err := resp.CopyReply(bufio.NewWriter(io.Discard), r, &ri); err != nil || r.Buffered() != 0 {
				t.Fatalf("reply %q is not one frame: %v", st.reply, err)
			}
			var head *entry
			if len(fifo) > 0 {
				head = &fifo[0]
			}
			o := c.replied(&ri, head)
			if o != unsolicited && o != confirming {
				fifo = fifo[1:]
			}
			words = append(words, string("ucCaq"[o]))
		case st.lose:
			fifo = nil
			words = append(words, map[bool]string{false: "l", true: "L"}[c.lost()])
		case st.refuse:
			c.refused()
		case st.local:
			words = append(words, map[bool]string{false: "r", true: "s"}[c.silent()])
		}
	}
	state = fmt.Sprintf("resp%d subs=%d/%d/%d", c.proto, c.nChan, c.nPat, c.nShard)
	if c.monitor {
		state += " monitor"
	}
	if c.multi {
		state += " multi"
	}
	for _, f := range []struct {
		on   bool
		name string
	}{{c.txnFailed, "failed"}, {c.txnLost, "txnlost"}, {c.watching, "watching"}, {c.watchLost, "watchlost"}, {c.tracking, "tracking"}} {
		if f.on {
			state += " " + f.name
		}
	}
	state += " replay=" + replayed(c.replay)
	if len(fifo) > 0 {
		state += fmt.Sprintf(" owed=%d", len(fifo))
	}
	return strings.Join(words, " "), state
}

// What play writes for a command the proxy answers in place of the
// backend (doomed), and for an EXEC it sends as DISCARD (replace).
var (
	doomedWords = map[string]string{
		string(replyTxnLost):      "!lost",
		string(replyExecAbort):    "!execabort",
		string(replyOK):           "!ok",
		string(replyNestedMulti):  "!nested",
		string(replyWatchInMulti): "!watch",
	}
	replacedWords = map[string]string{
		string(replyExecAbort): "X",
		string(replyNull2):     "N",
		string(replyNull3):     "_",
	}
)

// replayed names the commands a new connection would replay.
func replayed(r replayState) string {
	var names []string
	for _, raw := range r.commands(nil) {
		if raw != nil {
			cmd, _ := redcon.Parse(raw)
			args := make([]string, len(cmd.Args))
			for i, a := range cmd.Args {
				args[i] = strings.ToLower(string(a))
			}
			names = append(names, strings.Join(args, " "))
		}
	}
	return "[" + strings.Join(names, ",") + "]"
}

const (
	frSubA    = "*3\r\n$9\r\nsubscribe\r\n$1\r\na\r\n:1\r\n"
	frSubB    = "*3\r\n$9\r\nsubscribe\r\n$1\r\nb\r\n:2\r\n"
	frUnsubA  = "*3\r\n$11\r\nunsubscribe\r\n$1\r\na\r\n:1\r\n"
	frUnsubB  = "*3\r\n$11\r\nunsubscribe\r\n$1\r\nb\r\n:0\r\n"
	frPsub    = "*3\r\n$10\r\npsubscribe\r\n$2\r\np*\r\n:2\r\n"
	frSsub    = "*3\r\n$10\r\nssubscribe\r\n$1\r\ns\r\n:1\r\n"
	frMsg     = "*3\r\n$7\r\nmessage\r\n$1\r\na\r\n$2\r\nhi\r\n"
	frPmsg    = "*4\r\n$8\r\npmessage\r\n$2\r\np*\r\n$2\r\npq\r\n$2\r\nhi\r\n"
	frPush    = ">2\r\n$10\r\ninvalidate\r\n*1\r\n$1\r\nk\r\n"
	frPushMsg = ">3\r\n$7\r\nmessage\r\n$1\r\na\r\n$2\r\nhi\r\n"
	frMonitor = "+1700000000.123456 [0 127.0.0.1:5] \"GET\" \"k\"\r\n"
	frOK      = "+OK\r\n"
	frErr     = "-ERR no\r\n"
)

func TestConnState(t *testing.T) {
	tests := []struct {
		name  string
		give  []event
		trace string
		state string
	}{
		{
			name:  "plain",
			give:  []event{tx("GET k"), tx("SET k v"), rx("$1\r\nv\r\n"), rx(frOK)},
			trace: "r r a a",
			state: "resp2 subs=0/0/0 replay=[]",
		},
		{
			name:  "pipelined replies owed",
			give:  []event{tx("GET k"), tx("GET k")},
			trace: "r r",
			state: "resp2 subs=0/0/0 replay=[] owed=2",
		},
		{
			name:  "MULTI EXEC",
			give:  []event{tx("MULTI"), rx(frOK), tx("SET k v"), rx("+QUEUED\r\n"), tx("EXEC"), rx("*1\r\n+OK\r\n")},
			trace: "r a r a r a",
			state: "resp2 subs=0/0/0 replay=[]",
		},
		{
			name:  "MULTI is open as soon as it is sent",
			give:  []event{tx("MULTI"), tx("SET k v")},
			trace: "r r",
			state: "resp2 subs=0/0/0 multi replay=[] owed=2",
		},
		{
			name:  "MULTI DISCARD",
			give:  []event{tx("MULTI"), tx("DISCARD"), rx(frOK), rx(frOK)},
			trace: "r r a a",
			state: "resp2 subs=0/0/0 replay=[]",
		},
		{
			name:  "refused MULTI opens nothing",
			give:  []event{tx("MULTI"), tx("GET k"), rx("-ERR Can't execute 'multi'\r\n")},
			trace: "r r a",
			state: "resp2 subs=0/0/0 replay=[] owed=1",
		},
		{
			name:  "nested MULTI keeps the transaction",
			give:  []event{tx("MULTI"), rx(frOK), tx("MULTI"), rx("-ERR MULTI calls can not be nested\r\n")},
			trace: "r a r a",
			state: "resp2 subs=0/0/0 multi replay=[]",
		},
		{
			name:  "refused MULTI does not close a later transaction",
			give:  []event{tx("MULTI"), tx("DISCARD"), tx("MULTI"), rx(frErr), rx(frErr), rx(frOK)},
			trace: "r r r a a a",
			state: "resp2 subs=0/0/0 multi replay=[]",
		},
		{
			name:  "refused command aborts EXEC",
			give:  []event{tx("MULTI"), rx(frOK), refuse, tx("EXEC")},
			trace: "r a X",
			state: "resp2 subs=0/0/0 replay=[] owed=1",
		},
		{
			name:  "refused command outside a transaction",
			give:  []event{refuse, tx("MULTI"), tx("EXEC")},
			trace: "r r",
			state: "resp2 subs=0/0/0 replay=[] owed=2",
		},
		{
			name:  "DISCARD forgets a refusal",
			give:  []event{tx("MULTI"), refuse, tx("DISCARD"), tx("MULTI"), tx("EXEC")},
			trace: "r r r r",
			state: "resp2 subs=0/0/0 replay=[] owed=4",
		},
		{
			name:  "refusal pending at the transaction's EXEC",
			give:  []event{tx("MULTI"), refuse},
			trace: "r",
			state: "resp2 subs=0/0/0 multi failed replay=[] owed=1",
		},
		{
			name:  "WATCH is the backend's own",
			give:  []event{tx("WATCH k"), rx(frOK), tx("MULTI"), rx(frOK), tx("EXEC"), rx("*-1\r\n")},
			trace: "r a r a r a",
			state: "resp2 subs=0/0/0 replay=[]",
		},
		{
			name:  "WATCH and a transaction outlive the connection, lost",
			give:  []event{tx("WATCH k"), rx(frOK), tx("MULTI"), rx(frOK), refuse, lose},
			trace: "r a r a l",
			state: "resp2 subs=0/0/0 multi failed txnlost watching watchlost replay=[]",
		},
		{
			name:  "a transaction lost with its connection fails as a whole",
			give:  []event{tx("MULTI"), rx(frOK), tx("INCR a"), rx("+QUEUED\r\n"), lose, tx("INCR b"), tx("GET a"), tx("EXEC"), tx("GET a")},
			trace: "r a r a l !lost !lost !execabort r",
			state: "resp2 subs=0/0/0 replay=[] owed=1",
		},
		{
			name:  "a transaction whose MULTI was in flight is lost too",
			give:  []event{tx("MULTI"), tx("INCR a"), lose, tx("INCR b"), tx("EXEC")},
			trace: "r r l !lost !execabort",
			state: "resp2 subs=0/0/0 replay=[]",
		},
		{
			name:  "DISCARD ends a lost transaction",
			give:  []event{tx("MULTI"), rx(frOK), lose, tx("DISCARD"), tx("EXEC")},
			trace: "r a l !ok r",
			state: "resp2 subs=0/0/0 replay=[] owed=1",
		},
		{
			name:  "MULTI and WATCH in a lost transaction get Redis's errors",
			give:  []event{tx("MULTI"), rx(frOK), lose, tx("MULTI"), tx("WATCH k"), tx("PING"), tx("EXEC")},
			trace: "r a l !nested !watch !lost !execabort",
			state: "resp2 subs=0/0/0 replay=[]",
		},
		{
			name:  "RESET and QUIT leave a lost transaction",
			give:  []event{tx("MULTI"), rx(frOK), lose, tx("QUIT"), tx("RESET"), tx("GET k")},
			trace: "r a l r r r",
			state: "resp2 subs=0/0/0 replay=[] owed=3",
		},
		{
			name:  "EXEC after a lost WATCH aborts",
			give:  []event{tx("WATCH k"), rx(frOK), lose, tx("MULTI"), rx(frOK), tx("SET k v"), rx("+QUEUED\r\n"), tx("EXEC"), tx("MULTI"), tx("EXEC")},
			trace: "r a l r a r a N r r",
			state: "resp2 subs=0/0/0 replay=[] owed=3",
		},
		{
			name:  "EXEC after a lost WATCH aborts in RESP3",
			give:  []event{tx("HELLO 3"), rx("%0\r\n"), tx("WATCH k"), lose, tx("MULTI"), tx("EXEC")},
			trace: "r a r l r _",
			state: "resp3 subs=0/0/0 replay=[hello 3] owed=2",
		},
		{
			name:  "a lost WATCH and a refused command: EXECABORT",
			give:  []event{tx("WATCH k"), lose, tx("MULTI"), refuse, tx("EXEC")},
			trace: "r l r X",
			state: "resp2 subs=0/0/0 replay=[] owed=2",
		},
		{
			name:  "UNWATCH and DISCARD forget a lost WATCH",
			give:  []event{tx("WATCH k"), lose, tx("UNWATCH"), tx("MULTI"), tx("EXEC"), tx("WATCH k"), lose, tx("MULTI"), tx("DISCARD"), tx("MULTI"), tx("EXEC")},
			trace: "r l r r r r l r r r r",
			state: "resp2 subs=0/0/0 replay=[] owed=4",
		},
		{
			name:  "EXEC and DISCARD without MULTI keep a lost WATCH",
			give:  []event{tx("WATCH k"), lose, tx("EXEC"), tx("DISCARD"), tx("MULTI"), tx("EXEC")},
			trace: "r l r r r N",
			state: "resp2 subs=0/0/0 replay=[] owed=4",
		},
		{
			name:  "WATCH inside MULTI watches nothing",
			give:  []event{tx("MULTI"), tx("WATCH k"), tx("EXEC"), lose, tx("MULTI"), tx("EXEC")},
			trace: "r r r l r r",
			state: "resp2 subs=0/0/0 replay=[] owed=2",
		},
		{
			name:  "RESET forgets a lost WATCH",
			give:  []event{tx("WATCH k"), lose, tx("RESET"), tx("MULTI"), tx("EXEC")},
			trace: "r l r r r",
			state: "resp2 subs=0/0/0 replay=[] owed=3",
		},
		{
			name:  "a MULTI that could not be sent opens a lost transaction",
			give:  []event{unsent("MULTI"), tx("INCR a"), tx("EXEC"), tx("INCR a")},
			trace: "u !lost !execabort r",
			state: "resp2 subs=0/0/0 replay=[] owed=1",
		},
		{
			name:  "a WATCH that could not be sent aborts EXEC",
			give:  []event{unsent("WATCH k"), tx("MULTI"), tx("EXEC")},
			trace: "u r N",
			state: "resp2 subs=0/0/0 replay=[] owed=2",
		},
		{
			name:  "a client tracking keys is disconnected at a loss",
			give:  []event{tx("CLIENT TRACKING ON"), rx(frOK), lose},
			trace: "r a L",
			state: "resp2 subs=0/0/0 replay=[]",
		},
		{
			name:  "tracking turned off or refused keeps the client",
			give:  []event{tx("CLIENT TRACKING ON"), rx(frOK), tx("CLIENT TRACKING OFF"), rx(frOK), tx("CLIENT TRACKING ON"), rx(frErr), lose},
			trace: "r a r a r a l",
			state: "resp2 subs=0/0/0 replay=[]",
		},
		{
			name:  "RESET stops tracking",
			give:  []event{tx("CLIENT TRACKING ON"), rx(frOK), tx("RESET"), rx("+RESET\r\n"), lose},
			trace: "r a r a l",
			state: "resp2 subs=0/0/0 replay=[]",
		},
		{
			name:  "CLIENT NO-EVICT and NO-TOUCH are replayed once they succeeded",
			give:  []event{tx("CLIENT NO-EVICT on"), rx(frOK), tx("CLIENT NO-TOUCH on"), rx(frErr), tx("CLIENT NO-EVICT off"), rx(frOK)},
			trace: "r a r a r a",
			state: "resp2 subs=0/0/0 replay=[client no-evict off]",
		},
		{
			name: "HELLO's AUTH and SETNAME are replayed apart from its protocol",
			give: []event{tx("AUTH u1 p1"), rx(frOK), tx("CLIENT SETNAME a"), rx(frOK),
				tx("HELLO 3 AUTH u2 p2 SETNAME b"), rx("%0\r\n"), tx("HELLO 2"), rx("*0\r\n")},
			trace: "r a r a r a r a",
			state: "resp2 subs=0/0/0 replay=[hello 3 auth u2 p2 setname b,hello 2,client setname b]",
		},
		{
			name:  "an AUTH after HELLO's AUTH is the user replayed",
			give:  []event{tx("HELLO 3 AUTH u2 p2"), rx("%0\r\n"), tx("AUTH u1 p1"), rx(frOK)},
			trace: "r a r a",
			state: "resp3 subs=0/0/0 replay=[auth u1 p1,hello 3]",
		},
		{
			name:  "SELECT is replayed once it succeeded",
			give:  []event{tx("SELECT 3"), rx(frOK), tx("SELECT 99"), rx("-ERR DB index is out of range\r\n")},
			trace: "r a r a",
			state: "resp2 subs=0/0/0 replay=[select 3]",
		},
		{
			name:  "AUTH and CLIENT SETNAME are replayed",
			give:  []event{tx("AUTH pw"), rx(frOK), tx("CLIENT SETNAME me"), rx(frOK), tx("CLIENT GETNAME"), rx("$2\r\nme\r\n")},
			trace: "r a r a r a",
			state: "resp2 subs=0/0/0 replay=[auth pw,client setname me]",
		},
		{
			name:  "HELLO 3",
			give:  []event{tx("HELLO 3"), rx("%1\r\n+server\r\n+redis\r\n")},
			trace: "r a",
			state: "resp3 subs=0/0/0 replay=[hello 3]",
		},
		{
			name:  "refused HELLO changes nothing",
			give:  []event{tx("HELLO 4"), rx("-NOPROTO unsupported protocol version\r\n")},
			trace: "r a",
			state: "resp2 subs=0/0/0 replay=[]",
		},
		{
			name:  "HELLO without a version keeps the protocol",
			give:  []event{tx("HELLO 3"), rx("%0\r\n"), tx("HELLO"), rx("%0\r\n")},
			trace: "r a r a",
			state: "resp3 subs=0/0/0 replay=[hello]",
		},
		{
			name:  "SUBSCRIBE confirms each channel",
			give:  []event{tx("SUBSCRIBE a b"), rx(frSubA), rx(frSubB), rx(frMsg)},
			trace: "r c C u",
			state: "resp2 subs=2/0/0 replay=[]",
		},
		{
			name:  "UNSUBSCRIBE of everything",
			give:  []event{tx("SUBSCRIBE a b"), rx(frSubA), rx(frSubB), tx("UNSUBSCRIBE"), rx(frUnsubA), rx(frUnsubB)},
			trace: "r c C r c C",
			state: "resp2 subs=0/0/0 replay=[]",
		},
		{
			name:  "channels and patterns counted apart",
			give:  []event{tx("SUBSCRIBE a"), rx(frSubA), tx("PSUBSCRIBE p*"), rx(frPsub), rx(frPmsg), tx("SSUBSCRIBE s"), rx(frSsub)},
			trace: "r C r C u r C",
			state: "resp2 subs=1/1/1 replay=[]",
		},
		{
			name:  "a message-like array is an ordinary reply when not subscribed",
			give:  []event{tx("LRANGE l 0 -1"), rx(frMsg)},
			trace: "r a",
			state: "resp2 subs=0/0/0 replay=[]",
		},
		{
			name:  "a refused SUBSCRIBE is answered",
			give:  []event{tx("SUBSCRIBE"), rx("-ERR wrong number of arguments for 'subscribe' command\r\n")},
			trace: "r a",
			state: "resp2 subs=0/0/0 replay=[]",
		},
		{
			name:  "RESP3 pushes answer nothing",
			give:  []event{tx("HELLO 3"), rx("%0\r\n"), tx("GET k"), rx(frPush), rx(frPushMsg), rx("_\r\n")},
			trace: "r a r u u a",
			state: "resp3 subs=0/0/0 replay=[hello 3]",
		},
		{
			name:  "MONITOR lines answer nothing",
			give:  []event{tx("MONITOR"), rx(frOK), rx(frMonitor), tx("PING"), rx(frMonitor), rx("+PONG\r\n")},
			trace: "r a u r u a",
			state: "resp2 subs=0/0/0 monitor replay=[]",
		},
		{
			name:  "a line like MONITOR's before MONITOR is a reply",
			give:  []event{tx("GET k"), rx(frMonitor)},
			trace: "r a",
			state: "resp2 subs=0/0/0 replay=[]",
		},
		{
			name: "RESET",
			give: []event{tx("SELECT 3"), rx(frOK), tx("HELLO 3"), rx("%0\r\n"), tx("SUBSCRIBE a"), rx(">3\r\n$9\r\nsubscribe\r\n$1\r\na\r\n:1\r\n"),
				tx("MONITOR"), rx(frOK), tx("CLIENT REPLY OFF"), tx("RESET"), rx("+RESET\r\n")},
			trace: "r a r a r C r a - r a",
			state: "resp2 subs=0/0/0 replay=[]",
		},
		{
			name:  "RESET ends a transaction when sent",
			give:  []event{tx("MULTI"), refuse, tx("RESET"), tx("MULTI"), rx(frOK), rx("+RESET\r\n")},
			trace: "r r r a a",
			state: "resp2 subs=0/0/0 multi replay=[] owed=1",
		},
		{
			name:  "CLIENT REPLY OFF and ON",
			give:  []event{tx("CLIENT REPLY OFF"), tx("GET k"), local, tx("CLIENT REPLY ON"), tx("GET k")},
			trace: "- - s r r",
			state: "resp2 subs=0/0/0 replay=[] owed=2",
		},
		{
			name:  "CLIENT REPLY SKIP",
			give:  []event{tx("CLIENT REPLY SKIP"), tx("GET k"), tx("GET k"), tx("CLIENT REPLY SKIP"), local, local},
			trace: "- - r - s r",
			state: "resp2 subs=0/0/0 replay=[] owed=1",
		},
		{
			name:  "CLIENT REPLY SKIP while off is ignored",
			give:  []event{tx("CLIENT REPLY OFF"), tx("CLIENT REPLY SKIP"), tx("GET k"), tx("GET k")},
			trace: "- - - -",
			state: "resp2 subs=0/0/0 replay=[]",
		},
		{
			name:  "RESET turns replies on",
			give:  []event{tx("CLIENT REPLY OFF"), tx("RESET"), tx("GET k")},
			trace: "- r r",
			state: "resp2 subs=0/0/0 replay=[] owed=2",
		},
		{
			name:  "the proxy's AUTH after RESET",
			give:  []event{tx("RESET"), own, rx("+RESET\r\n"), rx(frOK)},
			trace: "r r a a",
			state: "resp2 subs=0/0/0 replay=[]",
		},
		{
			name:  "the proxy's own commands are not subject to CLIENT REPLY",
			give:  []event{tx("CLIENT REPLY SKIP"), own, tx("GET k"), tx("CLIENT REPLY OFF"), own, tx("GET k")},
			trace: "- r - - r -",
			state: "resp2 subs=0/0/0 replay=[] owed=2",
		},
		{
			name:  "QUIT",
			give:  []event{tx("GET k"), tx("QUIT"), rx("$-1\r\n"), rx(frOK)},
			trace: "r r a q",
			state: "resp2 subs=0/0/0 replay=[]",
		},
		{
			name:  "loss keeps what is replayed and the protocol",
			give:  []event{tx("SELECT 3"), rx(frOK), tx("HELLO 3"), rx("%0\r\n"), tx("GET k"), lose},
			trace: "r a r a r l",
			state: "resp3 subs=0/0/0 replay=[hello 3,select 3]",
		},
		{
			name:  "loss of a subscribed client",
			give:  []event{tx("SUBSCRIBE a"), rx(frSubA), lose},
			trace: "r C L",
			state: "resp2 subs=0/0/0 replay=[]",
		},
		{
			name:  "loss of a monitoring client",
			give:  []event{tx("MONITOR"), rx(frOK), lose},
			trace: "r a L",
			state: "resp2 subs=0/0/0 replay=[]",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			trace, state := play(t, tt.give)
			if trace != tt.trace {
				t.Errorf("trace %q, want %q", trace, tt.trace)
			}
			if state != tt.state {
				t.Errorf("state %q, want %q", state, tt.state)
			}
		})
	}
}
