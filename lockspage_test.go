package main

import (
	"bytes"
	"context"
	"fmt"
	"image/png"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/chromedp/cdproto/network"
	"github.com/chromedp/chromedp"
	"github.com/redis/go-redis/v9"

	"github.com/lockproxy/lockproxy/internal/redistest"
)

// screenshotEnv names the file where TestLocksPageInBrowser also saves its
// screenshot (the README's docs/locks-page.png:
// LOCKPROXY_SCREENSHOT=docs/locks-page.png go test -run TestLocksPageInBrowser).
const screenshotEnv = "LOCKPROXY_SCREENSHOT"

// browser starts a headless chromium (installed when missing) for the
// test, recording the body of every response it gets in bodies.
type browser struct {
	ctx    context.Context
	mu     sync.Mutex
	bodies map[string]string // "url #n" -> body
	missed []string          // responses whose body could not be read, and why
	// leaving is set once the test leaves the page: a response finished
	// after that may have no body to read any more.
	leaving atomic.Bool
	wg      sync.WaitGroup
}

func newBrowser(t *testing.T) *browser {
	path := redistest.Chromium(t)
	opts := []chromedp.ExecAllocatorOption{chromedp.ExecPath(path), chromedp.UserDataDir(t.TempDir()), chromedp.WindowSize(1280, 820)}
	for _, f := range redistest.ChromiumFlags {
		opts = append(opts, chromedp.Flag(strings.TrimPrefix(f, "--"), true))
	}
	actx, cancelAlloc := chromedp.NewExecAllocator(context.Background(), opts...)
	ctx, cancel := chromedp.NewContext(actx)
	b := &browser{ctx: ctx, bodies: make(map[string]string)}
	t.Cleanup(func() {
		cancel()
		cancelAlloc() // stops the browser process
		b.wg.Wait()
	})
	urls := make(map[network.RequestID]string)
	var umu sync.Mutex
	if err := chromedp.Listen(ctx, func(ev any) {
		switch e := ev.(type) {
		case *network.EventResponseReceived:
			umu.Lock()
			urls[e.RequestID] = e.Response.URL
			umu.Unlock()
		case *network.EventLoadingFinished:
			umu.Lock()
			url := urls[e.RequestID]
			umu.Unlock()
			leaving := b.leaving.Load()
			b.wg.Add(1)
			go func() {
				defer b.wg.Done()
				res, err := chromedp.Call(ctx, network.GetResponseBody, network.GetResponseBodyParams{RequestID: e.RequestID})
				if err != nil && !leaving {
					b.mu.Lock()
					b.missed = append(b.missed, url+": "+err.Error())
					b.mu.Unlock()
				}
				if err != nil {
					return
				}
				b.mu.Lock()
				b.bodies[fmt.Sprintf("%s #%d", url, len(b.bodies))] = string(res.Body)
				b.mu.Unlock()
			}()
		}
	}); err != nil {
		t.Fatalf("chromium: %v", err)
	}
	if _, err := chromedp.Call(ctx, network.Enable, network.EnableParams{}); err != nil {
		t.Fatalf("chromium: %v", err)
	}
	return b
}

// eval evaluates js in the page.
func eval[T any](t *testing.T, b *browser, js string) T {
	t.Helper()
	v, err := chromedp.Run(b.ctx, chromedp.Evaluate[T](js))
	if err != nil {
		t.Fatalf("evaluate %s: %v", js, err)
	}
	return v
}

// within waits at most d for the page to make js true, and returns how
// long it took.
func (b *browser) within(t *testing.T, d time.Duration, what, js string) time.Duration {
	t.Helper()
	start := time.Now()
	for {
		if eval[bool](t, b, "!!("+js+")") {
			return time.Since(start)
		}
		if time.Since(start) > d {
			page := eval[string](t, b, "document.body.innerText")
			t.Fatalf("the page did not show %s within %v:\n%s", what, d, page)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// row is the JavaScript for the cell of class col of resource's row.
func row(resource, col string) string {
	return fmt.Sprintf(`document.querySelector('#locks tr[data-resource=%q] td.%s')`, resource, col)
}

// TestLocksPageInBrowser drives the operators' page in a real headless
// chromium against a real proxy and real lock nodes: a lock taken through
// the proxy shows within a second with its holder and a validity that
// decreases, a waiter shows, the lock goes within a second of its UNLOCK,
// a node shows down within a second of its death and up after its
// restart, the filter narrows the list; no response the browser gets
// holds a token. It saves a screenshot of the page.
func TestLocksPageInBrowser(t *testing.T) {
	backend := redistest.Start(t)
	nodes, addrs := startNodes(t, 3)
	metricsAddr := unusedAddr(t)
	addr := startApp(t, fmt.Sprintf("metrics: {listen: %q}\nlock: {node_timeout: 250ms, max_permits: 8}\n", metricsAddr),
		"-backend", backend.Addr, "-lock-nodes", addrs)
	warmProxy(t, addr)
	ctx := context.Background()
	var tokens []string
	take := func(c *redis.Client, args ...any) string {
		t.Helper()
		v, err := c.Do(ctx, args...).Slice()
		if err != nil {
			t.Fatalf("%v: %v", args, err)
		}
		tokens = append(tokens, v[0].(string))
		return v[0].(string)
	}
	named := func(name string) *redis.Client {
		c := redis.NewClient(&redis.Options{Addr: addr, ClientName: name, PoolSize: 1, MaxRetries: -1})
		t.Cleanup(func() { c.Close() })
		return c
	}
	// Locks of every form, for the screenshot and the filter.
	reports := named("report-builder")
	take(reports, "LOCK", "reports:daily", 600000, "REENTRANT")
	take(reports, "LOCK", "reports:daily", 600000, "REENTRANT", "TOKEN", tokens[0])
	take(named("catalog-reader"), "RLOCK", "inventory:sku-1001", 120000)
	take(named("catalog-reader"), "RLOCK", "inventory:sku-1001", 120000)
	take(named("mailer"), "LOCK", "smtp:pool", 90000, "PERMITS", 4)
	take(named("mailer"), "LOCK", "smtp:pool", 90000, "PERMITS", 4)
	take(named("importer"), "MLOCK", 2, "inventory:sku-2002", "inventory:sku-2003", 300000)

	b := newBrowser(t)
	if err := chromedp.Do(b.ctx, chromedp.Navigate("http://"+metricsAddr+"/locks")); err != nil {
		t.Fatalf("navigate: %v", err)
	}
	b.within(t, 5*time.Second, "three nodes up", `document.querySelectorAll('#nodes td.state-up').length === 3`)
	b.within(t, 5*time.Second, "the locks taken before", row("reports:daily", "holds")+`?.textContent === "2"`)

	// A lock taken through the proxy shows within a second, with its
	// holder.
	billing := named("billing-worker")
	token := take(billing, "LOCK", "orders:42", 30000)
	took := b.within(t, time.Second, "orders:42", row("orders:42", "holder")+`?.textContent.startsWith("billing-worker@")`)
	t.Logf("orders:42 shown %v after its LOCK", took)
	holder := eval[string](t, b, row("orders:42", "holder")+".textContent")
	if !strings.Contains(holder, " via ") {
		t.Errorf("holder %q, want name@addr via proxy-id", holder)
	}
	// Its validity decreases.
	left := func() float64 {
		s := eval[string](t, b, row("orders:42", "validity")+".dataset.left")
		v, err := strconv.ParseFloat(s, 64)
		if err != nil {
			t.Fatalf("validity %q", s)
		}
		return v
	}
	v1 := left()
	time.Sleep(700 * time.Millisecond)
	if v2 := left(); !(v2 < v1 && v1 <= 30000 && v2 > 25000) {
		t.Errorf("validity %v then %v ms, want it decreasing from at most 30000", v1, v2)
	}
	// A waiter shows.
	waited := make(chan error, 1)
	go func() {
		_, err := named("late-worker").Do(ctx, "LOCK", "orders:42", 30000, "WAIT", 2500).Result()
		waited <- err
	}()
	b.within(t, time.Second, "the waiter", row("orders:42", "waiters")+`?.textContent === "1"`)
	b.within(t, time.Second, "every row", `document.querySelectorAll('#locks tbody tr').length === 6`)
	pngBuf, err := chromedp.Run(b.ctx, chromedp.FullScreenshot(100))
	if err != nil {
		t.Fatalf("screenshot: %v", err)
	}
	if err := <-waited; err != redis.Nil {
		t.Fatalf("the waiter: %v, want a null after its WAIT", err)
	}
	b.within(t, time.Second, "no waiter", row("orders:42", "waiters")+`?.textContent === "0"`)

	// The lock goes within a second of its UNLOCK.
	if n, err := billing.Do(ctx, "UNLOCK", "orders:42", token).Int64(); err != nil || n != 1 {
		t.Fatalf("UNLOCK: %v %v", n, err)
	}
	took = b.within(t, time.Second, "orders:42 gone", row("orders:42", "holder")+` === null`)
	t.Logf("orders:42 gone %v after its UNLOCK", took)

	// A node down shows within a second, and up again after its restart.
	nodes[2].Kill()
	took = b.within(t, time.Second, "node 2 down", `document.querySelector('#nodes tr[data-node="2"] td.state').textContent === "down"`)
	t.Logf("node 2 down %v after its death", took)
	nodes[2].Restart()
	b.within(t, 15*time.Second, "node 2 up", `document.querySelector('#nodes tr[data-node="2"] td.state').textContent === "up"`)

	// Two of three nodes cut off: the page says why it cannot list, and
	// lists again once they are back.
	nodes[0].CutOff()
	nodes[1].CutOff()
	b.within(t, 2*time.Second, "NOQUORUM", `!document.getElementById("error").hidden && document.getElementById("error").textContent.includes("NOQUORUM")`)
	nodes[0].Reconnect()
	nodes[1].Reconnect()
	b.within(t, 10*time.Second, "the locks again", `document.getElementById("error").hidden && document.querySelectorAll('#locks tbody tr').length === 5`)

	// The filter narrows the list.
	if err := chromedp.Do(b.ctx, chromedp.SendKeys(chromedp.ID("match"), "inventory:*")); err != nil {
		t.Fatal(err)
	}
	b.within(t, time.Second, "the inventory locks only", `(() => {
		const rows = [...document.querySelectorAll('#locks tbody tr')].map(r => r.dataset.resource);
		return rows.length === 3 && rows.every(r => r.startsWith("inventory:"));
	})()`)
	b.within(t, time.Second, "the filter in the address", `location.hash.includes("inventory")`)

	// No token in any response the browser got, nor in the page.
	stats := eval[string](t, b, `(() => {
		const d = performance.getEntriesByType("resource").filter(e => e.name.includes("/locks.json")).map(e => e.duration).sort((a, b) => a - b);
		return d.length + " reads of /locks.json, median " + d[d.length >> 1].toFixed(0) + " ms, max " + d[d.length - 1].toFixed(0) + " ms";
	})()`)
	t.Log(stats)
	html := eval[string](t, b, "document.documentElement.outerHTML")
	b.leaving.Store(true)
	if err := chromedp.Do(b.ctx, chromedp.Navigate("about:blank")); err != nil {
		t.Fatal(err)
	}
	b.wg.Wait()
	b.mu.Lock()
	bodies := b.bodies
	bodies["outerHTML"] = html
	json := 0
	for url, body := range bodies {
		if strings.Contains(url, "/locks.json") {
			json++
		}
		for _, tok := range tokens {
			if strings.Contains(body, tok) {
				t.Errorf("%s holds a token", url)
			}
		}
	}
	b.mu.Unlock()
	for _, want := range []string{"/locks #", "/locks/app.js", "/locks/style.css"} {
		found := false
		for url := range bodies {
			found = found || strings.Contains(url, want)
		}
		if !found {
			t.Errorf("no response for %s was read", want)
		}
	}
	if json < 10 {
		t.Errorf("%d responses of /locks.json read, want many", json)
	}
	if len(b.missed) > 0 {
		t.Errorf("responses whose body could not be checked: %q", b.missed)
	}
	t.Logf("%d responses checked for tokens", len(bodies))

	// Bad parameters of /locks.json, and the headers of the page.
	for _, q := range []string{"cursor=abc", "count=0", "count=x", "cursor=3"} {
		resp, err := http.Get("http://" + metricsAddr + "/locks.json?" + q)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusBadRequest {
			t.Errorf("/locks.json?%s: %d, want 400", q, resp.StatusCode)
		}
	}
	resp, err := http.Get("http://" + metricsAddr + "/locks")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if csp := resp.Header.Get("Content-Security-Policy"); !strings.Contains(csp, "default-src 'self'") || resp.Header.Get("Cache-Control") != "no-store" {
		t.Errorf("/locks headers: %v", resp.Header)
	}

	// The screenshot.
	img, err := png.Decode(bytes.NewReader(pngBuf))
	if err != nil || img.Bounds().Dx() < 800 {
		t.Fatalf("screenshot: %v", err)
	}
	if err := os.WriteFile(filepath.Join(t.TempDir(), "locks-page.png"), pngBuf, 0o644); err != nil {
		t.Fatal(err)
	}
	if path := os.Getenv(screenshotEnv); path != "" {
		if err := os.WriteFile(path, pngBuf, 0o644); err != nil {
			t.Fatal(err)
		}
		t.Logf("screenshot saved to %s", path)
	}
}
