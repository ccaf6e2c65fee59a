package e2e

import (
	"fmt"
	"testing"
	"time"
)

// TestBrowserChatAndOps drives the gateway's pages in headless Chromium:
// two users chat in two tabs (one sends, the other sees the message with
// the seq the sender was told; a tab that went offline catches up with
// sync); a second tab of the same user shows unread counts that drop when
// the first tab opens the conversation (read markers); join, kick, older
// and leave go through the page, and its protocol log shows the frames;
// then the /ops page watches a worker die and its vshards move to the
// other one. Screenshots go to the folder the test prints.
func TestBrowserChatAndOps(t *testing.T) {
	sharing(t, 25, 21)
	exe := chromiumPath(t)
	shots := artifactsDir(t)
	dev := startDev(t, t.TempDir(), "--workers", "0")
	wa, _ := twoWorkers(t, dev)
	base := dev.EP.HTTP
	b := startBrowser(t, exe, shots)

	// Two users, each in a tab that mints a dev token and connects.
	alice := b.tab("alice", base+"/?user=alice")
	bob := b.tab("bob", base+"/?user=bob")
	for _, tb := range []*tab{alice, bob} {
		waitJS(tb, 30*time.Second, "the websocket to open", `document.querySelector('#status').dataset.state`,
			func(s string) bool { return s == "open" })
	}

	conv := fmt.Sprintf("room-%d", time.Now().UnixNano()%1_000_000)
	alice.setValue("#new-conv-id", conv)
	alice.setValue("#new-conv-members", "bob")
	alice.click("#create")
	waitJS(alice, 30*time.Second, "the conversation to be created", `document.querySelector('#conv-title').textContent`,
		func(s string) bool { return s == conv })

	seq := send(alice, conv, "hello bob")
	if seq != 2 { // 1 is the create
		t.Errorf("alice's message got seq %d, want 2", seq)
	}
	alice.screenshot("1-alice-sent")
	sees(bob, conv, seq, "hello bob")
	bob.screenshot("2-bob-received")

	// Bob goes offline; what alice sends meanwhile reaches him through
	// sync when he is back, once.
	bob.click("#offline")
	waitJS(bob, 10*time.Second, "bob to be offline", `document.querySelector('#status').dataset.state`,
		func(s string) bool { return s == "offline" })
	away := send(alice, conv, "while you were away")
	bob.click("#offline")
	sees(bob, conv, away, "while you were away")
	bob.screenshot("3-bob-synced")

	// Read markers. Bob's open, visible conversation is read up to what it
	// shows; a second tab of bob gets the marker pushed.
	bob2 := b.tab("bob2", base+"/?user=bob")
	waitJS(bob2, 30*time.Second, "the websocket to open", `document.querySelector('#status').dataset.state`,
		func(s string) bool { return s == "open" })
	sees(bob2, conv, away, "while you were away")
	for _, tb := range []*tab{bob, bob2} {
		pageUnread(tb, conv, 0, away)
	}
	// Alice writes in a second conversation that neither of bob's tabs has open.
	conv2 := conv + "-b"
	alice.setValue("#new-conv-id", conv2)
	alice.setValue("#new-conv-members", "bob")
	alice.click("#create")
	waitJS(alice, 30*time.Second, "the second conversation to be created", `document.querySelector('#conv-title').textContent`,
		func(s string) bool { return s == conv2 })
	last2 := 0
	for i := 1; i <= 3; i++ {
		last2 = send(alice, conv2, fmt.Sprintf("unread %d", i))
	}
	for _, tb := range []*tab{bob, bob2} {
		pageUnread(tb, conv2, 3, 0)
	}
	bob2.screenshot("4-bob2-unread")
	// Bob opens it in his first tab: both tabs' counts drop.
	selectConv(bob, conv2)
	pageUnread(bob, conv2, 0, last2)
	pageUnread(bob2, conv2, 0, last2)
	bob2.screenshot("5-bob2-read-in-the-other-tab")

	// Membership from the page: alice adds carol to the second
	// conversation and removes her; bob pages back with older (nothing is
	// older than what sync gave him) and leaves it.
	alice.setValue("#add-member-id", "carol")
	alice.click("#add-member-btn")
	waitJS(alice, 30*time.Second, "carol to be a member", `!!document.querySelector('#members [data-user="carol"]')`,
		func(ok bool) bool { return ok })
	// One click: the kick's event may come after the next poll, and a
	// second kick of a member already kicked is refused (not_found), which
	// replaces the page's note.
	waitJS(alice, 30*time.Second, "carol's kick button, then her removal", `(() => {
		const x = document.querySelector('#members [data-user="carol"] button.kick');
		if (x && !window.kickedCarol) { window.kickedCarol = true; x.click(); }
		return !document.querySelector('#members [data-user="carol"]') && document.querySelector('#note').textContent.startsWith('kick carol accepted');
	})()`, func(ok bool) bool { return ok })
	bob.click("#older")
	waitJS(bob, 30*time.Second, "older to find nothing older", `document.querySelector('#note').textContent`,
		func(s string) bool { return s == "nothing older in "+conv2 })
	waitJS(bob, 10*time.Second, "bob's leave", `(() => {
		window.confirm = () => true;
		document.querySelector('#leave').click();
		return true;
	})()`, func(ok bool) bool { return ok })
	waitJS(bob, 30*time.Second, "bob to be out of "+conv2, `document.querySelector('#conv-title').textContent + '|' + document.querySelector('#composer').hidden`,
		func(s string) bool { return s == conv2+" (you are no longer a member)|true" })
	waitJS(bob2, 30*time.Second, "bob's other tab to see him out", fmt.Sprintf(`document.querySelector('#conv-list li[data-conv=%s]').classList.contains('removed')`, js(conv2)),
		func(ok bool) bool { return ok })
	// The protocol log shows the frames both ways.
	waitJS(bob, 10*time.Second, "the protocol log", `(() => {
		const t = document.querySelector('#log').textContent;
		return ['→ {"op":"history"', '← {"op":"history"', '→ {"op":"leave"', '→ {"op":"read"', '← {"op":"read","conversation_id"', '·· closed 4000']
			.filter((s) => !t.includes(s));
	})()`, func(missing []string) bool { return len(missing) == 0 })
	bob.screenshot("5b-bob-left")

	// The pipeline page: two workers, about half of the vshards each (the
	// grid shows the hashed vshards; the dedicated ones, in their own
	// table, are shared out with them).
	ops := b.tab("ops", base+"/ops")
	vs := dev.EP.VShards
	before := waitJS(ops, 30*time.Second, "the grid to show both workers", cellsJS,
		func(c cells) bool {
			return c.N == vs && c.Owner["wa"] >= vs/2-dev.EP.Dedicated && c.Owner["wb"] >= vs/2-dev.EP.Dedicated && c.Owner["wa"]+c.Owner["wb"] == vs && c.Live == vs
		})
	ops.screenshot("6-ops-two-workers")

	wa.Kill9()
	waitJS(ops, 30*time.Second, "wa to show as down", `(document.querySelector('#workers tr[data-worker="wa"]') || {dataset: {}}).dataset.state`,
		func(s string) bool { return s == "unreachable" || s == "gone" })
	ops.screenshot("7-ops-worker-down")
	after := waitJS(ops, 90*time.Second, "wa's vshards to move to wb", cellsJS,
		func(c cells) bool { return c.N == vs && c.Owner["wb"] == vs && c.Live == vs })
	for v, w := range before.Worker {
		if w == "wa" && after.Epoch[v] <= before.Epoch[v] {
			t.Errorf("vshard %d moved from wa to wb but its epoch went %d → %d", v, before.Epoch[v], after.Epoch[v])
		}
	}
	waitJS(ops, 30*time.Second, "wa's row to say gone", `(document.querySelector('#workers tr[data-worker="wa"]') || {dataset: {}}).dataset.state`,
		func(s string) bool { return s == "gone" })
	time.Sleep(2 * time.Second) // let the moved cells' flash and colour change end
	ops.screenshot("8-ops-after-takeover")

	// The chat goes on on the surviving worker.
	selectConv(alice, conv)
	last := send(alice, conv, "after the takeover")
	sees(bob, conv, last, "after the takeover")
	bob.screenshot("9-bob-after-takeover")
}

// cells is what the ops page's grid shows.
type cells struct {
	N      int            `json:"n"`
	Live   int            `json:"live"`
	Owner  map[string]int `json:"owner"`  // cells by owner
	Worker []string       `json:"worker"` // by vshard
	Epoch  []int64        `json:"epoch"`  // by vshard
}

const cellsJS = `(() => {
	const cs = [...document.querySelectorAll('#grid .cell')];
	const owner = {};
	for (const c of cs) owner[c.dataset.worker] = (owner[c.dataset.worker] || 0) + 1;
	return {n: cs.length, live: cs.filter((c) => c.dataset.live === 'true').length, owner,
		worker: cs.map((c) => c.dataset.worker || ''), epoch: cs.map((c) => Number(c.dataset.epoch || 0))};
})()`

// send types body into the tab's composer, sends it and returns the seq of
// its `accepted` answer, as the page shows it.
func send(tb *tab, conv, body string) int {
	tb.t.Helper()
	tb.setValue("#body", body)
	tb.click("#send")
	return waitJS(tb, 60*time.Second, fmt.Sprintf("%q to be accepted", body), fmt.Sprintf(`(() => {
		const e = [...document.querySelectorAll('#events li.ev[data-kind="message"]')]
			.find((e) => e.dataset.conv === %s && e.dataset.acceptedSeq && e.querySelector('.body').textContent === %s);
		return e ? Number(e.dataset.acceptedSeq) : 0;
	})()`, js(conv), js(body)), func(n int) bool { return n > 0 })
}

// sees waits until the tab shows the delivered event seq of conv, once,
// with body.
func sees(tb *tab, conv string, seq int, body string) {
	tb.t.Helper()
	selectConv(tb, conv)
	got := waitJS(tb, 30*time.Second, fmt.Sprintf("event %s #%d", conv, seq), fmt.Sprintf(`(() => {
		const es = [...document.querySelectorAll('#events li.ev')].filter((e) => e.dataset.conv === %s && e.dataset.seq === %s);
		return es.map((e) => e.dataset.src + ':' + e.querySelector('.body').textContent);
	})()`, js(conv), js(fmt.Sprint(seq))), func(es []string) bool { return len(es) > 0 })
	if len(got) != 1 || got[0] != "event:"+body {
		tb.fail("event %s #%d shows as %q, want one delivered event %q", conv, seq, got, body)
	}
}

// selectConv waits until the tab lists conv, then opens it.
func selectConv(tb *tab, conv string) {
	tb.t.Helper()
	waitJS(tb, 30*time.Second, fmt.Sprintf("%s to list %s", tb.name, conv), fmt.Sprintf(`!!document.querySelector('#conv-list li[data-conv=%s]')`, js(conv)),
		func(ok bool) bool { return ok })
	// The list is drawn anew on every event: click it from inside the page
	// rather than through a node that may be gone by the time of the click.
	waitJS(tb, 10*time.Second, "select "+conv, fmt.Sprintf(`(() => {
		const li = document.querySelector('#conv-list li[data-conv=%s]');
		if (li) li.click();
		return document.querySelector('#conv-title').textContent.startsWith(%s);
	})()`, js(conv), js(conv)), func(ok bool) bool { return ok })
}

// pageUnread waits until the tab's list shows n unread messages in conv (a
// badge of n, none for 0) and a read marker of readSeq.
func pageUnread(tb *tab, conv string, n, readSeq int) {
	tb.t.Helper()
	want := fmt.Sprintf("%d/%d/%s", n, readSeq, map[bool]string{true: fmt.Sprint(n), false: ""}[n > 0])
	waitJS(tb, 30*time.Second, fmt.Sprintf("%s to show %s with %d unread, read up to #%d (unread/read_seq/badge %s)", tb.name, conv, n, readSeq, want),
		fmt.Sprintf(`(() => {
		const li = document.querySelector('#conv-list li[data-conv=%s]');
		if (!li) return '';
		const badge = li.querySelector('.badge');
		return li.dataset.unread + '/' + li.dataset.readSeq + '/' + (badge ? badge.textContent : '');
	})()`, js(conv)), func(s string) bool { return s == want })
}
