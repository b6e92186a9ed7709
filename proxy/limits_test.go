package proxy

import (
	"strings"
	"testing"
)

// BenchmarkRequestScan runs the request scanner over typical reads: one
// GET, a pipeline of 16 SETs, and one SET of a 16 KB value.
func BenchmarkRequestScan(b *testing.B) {
	for _, tc := range []struct{ name, read string }{
		{"GET", "*2\r\n$3\r\nGET\r\n$9\r\nbench:key\r\n"},
		{"SET pipeline=16", strings.Repeat("*3\r\n$3\r\nSET\r\n$9\r\nbench:key\r\n$3\r\nxxx\r\n", 16)},
		{"SET 16KB", "*3\r\n$3\r\nSET\r\n$9\r\nbench:key\r\n$16384\r\n" + strings.Repeat("v", 16384) + "\r\n"},
	} {
		b.Run(tc.name, func(b *testing.B) {
			sc := requestScanner{maxBulk: 512 << 20, maxMultibulk: 1 << 20, maxInline: 64 << 10}
			buf := make([]byte, len(tc.read))
			b.SetBytes(int64(len(tc.read)))
			b.ReportAllocs()
			b.ResetTimer()
			for b.Loop() {
				copy(buf, tc.read)
				if n, err := sc.scan(buf); n != len(buf) || err != nil {
					b.Fatal(n, err)
				}
			}
		})
	}
}
