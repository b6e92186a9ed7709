package resp

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
		b.Run(tc.name+"/whole", func(b *testing.B) {
			sc := Scanner{MaxBulk: 512 << 20, MaxMultibulk: 1 << 20, MaxInline: 64 << 10}
			buf := make([]byte, len(tc.read))
			b.SetBytes(int64(len(tc.read)))
			b.ReportAllocs()
			b.ResetTimer()
			for b.Loop() {
				copy(buf, tc.read)
				if n, err := sc.Scan(buf); n != len(buf) || err != nil {
					b.Fatal(n, err)
				}
			}
		})
		// The same requests cut into reads of 7 bytes, which take the
		// byte-by-byte path.
		b.Run(tc.name+"/in reads of 7", func(b *testing.B) {
			sc := Scanner{MaxBulk: 512 << 20, MaxMultibulk: 1 << 20, MaxInline: 64 << 10}
			buf := make([]byte, len(tc.read))
			var spill [64]byte
			b.SetBytes(int64(len(tc.read)))
			b.ReportAllocs()
			b.ResetTimer()
			for b.Loop() {
				copy(buf, tc.read)
				out := 0
				for i := 0; i < len(buf); i += 7 {
					n, err := sc.Scan(buf[i:min(i+7, len(buf))])
					if err != nil {
						b.Fatal(err)
					}
					for out += n; sc.Pending(); {
						out += sc.Drain(spill[:])
					}
				}
				if out != len(buf) {
					b.Fatalf("%d bytes out of %d", out, len(buf))
				}
			}
		})
	}
}
