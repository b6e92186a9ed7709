package proxy

import (
	"errors"
	"strconv"
	"strings"
)

// testFencing is a Fencing for the proxy's own tests: it parses FENCED as
// commands.ParseFenced does for well-formed arguments.
func testFencing(counts map[FencedOutcome]int) *Fencing {
	return &Fencing{
		Parse: func(args [][]byte) (FencedRequest, error) {
			if len(args) < 4 {
				return FencedRequest{}, errors.New("ERR wrong number of arguments for 'fenced' command")
			}
			f, err := strconv.ParseInt(string(args[2]), 10, 64)
			if err != nil || f < 1 {
				return FencedRequest{}, errors.New("ERR fence is not a positive integer")
			}
			req := FencedRequest{Resource: args[1], Fence: f, Slot: -1, Command: args[3:]}
			if strings.EqualFold(string(args[3]), "permit") {
				req.Slot, _ = strconv.ParseInt(string(args[4]), 10, 64)
				req.Command = args[5:]
			}
			return req, nil
		},
		Done: func(o FencedOutcome) {
			if counts != nil {
				counts[o]++
			}
		},
	}
}
