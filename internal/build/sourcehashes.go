package build

import (
	"encoding/json"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kiln-build/kiln/internal/buildkit"
	"github.com/kiln-build/kiln/internal/explain"
)

// sourceHashesFile keeps the digest of every source file explain read,
// with its stat.
const sourceHashesFile = "source-hashes.json"

// sourceHashes gives explain each source file's digest, reading only the
// files whose stat changed since the last build: on a vendored tree,
// reading all of them took longer than the go list cache's check. As git's
// index, it trusts a stat that was at least racyWindow old when recorded.
type sourceHashes struct {
	path, root string
	began      int64
	was, now   map[string]hashedFile
	// stats are the files' stats taken side by side before hashing: one at
	// a time, a vendored tree's 5,600 took 16 ms.
	stats map[string]statResult
}

// statResult is what statPath returned.
type statResult struct {
	st pathStat
	ok bool
}

type hashedFile struct {
	Stat pathStat `json:"st"`
	Hash string   `json:"h"`
}

type sourceHashesRecord struct {
	RecordedAt int64                 `json:"recordedAt"`
	Files      map[string]hashedFile `json:"files"`
}

// loadSourceHashes reads the last build's digests; began is when this build
// began, by the clock of the file system when it could be read.
func loadSourceHashes(outDir, root string, began noopStart) *sourceHashes {
	return loadSourceHashesTrusting(outDir, root, began, racyWindow)
}

// loadSourceHashesTrusting is loadSourceHashes with the racy window read
// by the caller (tests change it).
func loadSourceHashesTrusting(outDir, root string, began noopStart, window time.Duration) *sourceHashes {
	at := time.Now()
	if began.ok {
		at = began.at
	}
	h := &sourceHashes{path: filepath.Join(outDir, explainDir, sourceHashesFile), root: root, began: at.UnixNano(), now: map[string]hashedFile{}}
	var rec sourceHashesRecord
	if data, err := os.ReadFile(h.path); err == nil && json.Unmarshal(data, &rec) == nil {
		h.was = rec.Files
		trusted := rec.RecordedAt - int64(window)
		for rel, f := range h.was {
			if f.Stat.ModTime >= trusted || f.Stat.Change >= trusted {
				delete(h.was, rel)
			}
		}
	}
	return h
}

// pendingHashes is a loadSourceHashes running for one output folder and
// root, so that reading the record overlaps resolving the plan.
type pendingHashes struct {
	outDir, root string
	done         chan *sourceHashes
}

func loadSourceHashesAsync(outDir, root string, began noopStart) *pendingHashes {
	p := &pendingHashes{outDir: outDir, root: root, done: make(chan *sourceHashes, 1)}
	window := racyWindow
	go func() { p.done <- loadSourceHashesTrusting(outDir, root, began, window) }()
	return p
}

// take is the record loaded for outDir and root: the pending one when it
// was started for them, else one read now.
func (p *pendingHashes) take(outDir, root string, began noopStart) *sourceHashes {
	if p != nil && p.outDir == outDir && p.root == root {
		if h, ok := <-p.done; ok {
			close(p.done) // taken once; a second take reads anew
			return h
		}
	}
	return loadSourceHashes(outDir, root, began)
}

// prestat stats the files of the root that hash will be asked for, on
// every CPU.
func (h *sourceHashes) prestat(rels []string) {
	stats := make([]statResult, len(rels))
	var next atomic.Int64
	var wg sync.WaitGroup
	for range min(runtime.GOMAXPROCS(0), len(rels)) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := int(next.Add(1) - 1); i < len(rels); i = int(next.Add(1) - 1) {
				st, ok := statPath(filepath.Join(h.root, rels[i]))
				stats[i] = statResult{st, ok}
			}
		}()
	}
	wg.Wait()
	h.stats = make(map[string]statResult, len(rels))
	for i, rel := range rels {
		h.stats[rel] = stats[i]
	}
}

// hash is the digest explain records for a file of the root.
func (h *sourceHashes) hash(rel string) (string, error) {
	path := filepath.Join(h.root, rel)
	pre, taken := h.stats[rel]
	st, ok := pre.st, pre.ok
	if !taken {
		st, ok = statPath(path)
	}
	if was, seen := h.was[rel]; ok && seen && st.Size >= 0 && was.Stat == st {
		h.now[rel] = was
		return was.Hash, nil
	}
	data, err := os.ReadFile(path)
	if err != nil {
		return "", err
	}
	f := hashedFile{Stat: st, Hash: explain.Digest(data)}
	if ok {
		h.now[rel] = f
	}
	return f.Hash, nil
}

// save records this build's digests; a build that could not write it
// reads every file next time.
func (h *sourceHashes) save() {
	buildkit.WriteAtomic(h.path, func(w io.Writer) error {
		return json.NewEncoder(w).Encode(sourceHashesRecord{RecordedAt: h.began, Files: h.now})
	})
}
