package commands

import (
	"errors"
	"os"
	"strings"
	"testing"

	"github.com/lockproxy/lockproxy/quorum"
)

// TestProtocolDocument: every error text the commands reply with is in
// the protocol document, so that it cannot fall behind the code.
func TestProtocolDocument(t *testing.T) {
	raw, err := os.ReadFile("../docs/PROTOCOL.md")
	if err != nil {
		t.Fatal(err)
	}
	doc := string(raw)
	h := mustNew(t, nil, DefaultConfig(), nil)
	texts := []string{msgTimedOut, msgCancelled, msgUnexpected, "NOQUORUM <n> of <N> lock nodes answered"}
	for _, err := range []error{
		errSyntax, errNotInteger, errEmptyToken, errWaitNegative, errNoToken, errClosed,
		errArityLock, errArityUnlock, errArityExtend, errExpireLock, errExpireExtend,
		h.errTTLMax, h.errWaitMax, h.errPermMax, errArityRLock, errExpireRLock, errPermitsRange,
	} {
		texts = append(texts, err.Error())
	}
	for _, text := range texts {
		// The configured maxima stand as <max_ttl> and <max_wait>.
		text = strings.Replace(text, "maximum of 3600000", "maximum of <max_ttl>", 1)
		text = strings.Replace(text, "maximum of 60000", "maximum of <max_wait>", 1)
		text = strings.Replace(text, "maximum of 1024", "maximum of <max_permits>", 1)
		if !strings.Contains(doc, "`-"+text+"`") {
			t.Errorf("docs/PROTOCOL.md lacks `-%s`", text)
		}
	}
	// The mode and deadlock replies as the engine words them.
	for _, text := range []string{"LOCKMODE held exclusively", "LOCKMODE held shared", "LOCKMODE held as a semaphore of <k> permits",
		"DEADLOCK this token holds the write lock of the resource"} {
		if !strings.Contains(doc, "`-"+text) {
			t.Errorf("docs/PROTOCOL.md lacks `-%s`", text)
		}
	}
	// The NOQUORUM reply as the code writes it.
	reply := string(appendEngineErr(nil, errors.Join(errors.New("x"), &quorum.NoQuorumError{Answered: 1, Total: 3})))
	if !strings.HasPrefix(reply, "-NOQUORUM 1 of 3 lock nodes answered") {
		t.Errorf("NOQUORUM reply %q: the document describes another", reply)
	}
}
