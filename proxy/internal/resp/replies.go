package resp

// Replies of the proxy's own that more than one package sends.
var (
	ReplyOK              = []byte("+OK\r\n")
	ReplySyntax          = []byte("-ERR syntax error\r\n")
	ReplyConnLost        = []byte("-ERR backend unavailable: connection lost\r\n")
	ReplyExecAbort       = []byte("-EXECABORT Transaction discarded because of previous errors.\r\n")
	ReplyReplicaKeyspace = []byte("-ERR Replica can't interact with the keyspace\r\n")
	CmdDiscard           = []byte("*1\r\n$7\r\nDISCARD\r\n")
	CmdMulti             = []byte("*1\r\n$5\r\nMULTI\r\n")
)

// ErrorReply encodes err as a Redis "-ERR ..." reply on one line.
func ErrorReply(err error) []byte {
	msg := err.Error()
	b := make([]byte, 0, len(msg)+8)
	b = append(b, "-ERR "...)
	for i := 0; i < len(msg); i++ {
		c := msg[i]
		if c == '\r' || c == '\n' {
			c = ' '
		}
		b = append(b, c)
	}
	return append(b, '\r', '\n')
}
