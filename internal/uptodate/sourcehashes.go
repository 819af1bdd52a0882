package uptodate

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kiln-build/kiln/internal/atomicfile"
)

// SourceHashesFile keeps the digest of every source file explain read,
// with its stat.
const SourceHashesFile = "source-hashes.json"

// SourceHashes gives explain each source file's digest, reading only the
// files whose stat changed since the last build: on a vendored tree,
// reading all of them took longer than the go list cache's check. As git's
// index, it trusts a stat that was at least RacyWindow old when recorded.
type SourceHashes struct {
	path, root string
	began      int64
	was, now   map[string]hashedFile
	// stats are the files' stats taken side by side before hashing: one at
	// a time, a vendored tree's 5,600 took 16 ms.
	stats map[string]statResult
	// unsure is set when a file was hashed without a stat to tell a later
	// change by: Changed then says so.
	unsure bool
}

// statResult is what StatPath returned.
type statResult struct {
	st Stat
	ok bool
}

type hashedFile struct {
	Stat Stat   `json:"st"`
	Hash string `json:"h"`
}

type sourceHashesRecord struct {
	RecordedAt int64                 `json:"recordedAt"`
	Files      map[string]hashedFile `json:"files"`
}

// LoadSourceHashes reads the last build's digests from the record at path
// for the files of root; began is when this build began, by the clock of
// the file system when it could be read.
func LoadSourceHashes(path, root string, began Clock) *SourceHashes {
	return loadSourceHashesTrusting(path, root, began, RacyWindow)
}

// loadSourceHashesTrusting is LoadSourceHashes with the racy window read
// by the caller (tests change it).
func loadSourceHashesTrusting(path, root string, began Clock, window time.Duration) *SourceHashes {
	at := time.Now()
	if began.OK {
		at = began.At
	}
	h := &SourceHashes{path: path, root: root, began: at.UnixNano(), now: map[string]hashedFile{}}
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

// PendingHashes is a LoadSourceHashes running for one record and root, so
// that reading the record overlaps resolving the plan.
type PendingHashes struct {
	path, root string
	done       chan *SourceHashes
}

// LoadSourceHashesAsync starts LoadSourceHashes.
func LoadSourceHashesAsync(path, root string, began Clock) *PendingHashes {
	p := &PendingHashes{path: path, root: root, done: make(chan *SourceHashes, 1)}
	window := RacyWindow
	go func() { p.done <- loadSourceHashesTrusting(path, root, began, window) }()
	return p
}

// Take is the record loaded for path and root: the pending one when it was
// started for them, else one read now.
func (p *PendingHashes) Take(path, root string, began Clock) *SourceHashes {
	if p != nil && p.path == path && p.root == root {
		if h, ok := <-p.done; ok {
			close(p.done) // taken once; a second take reads anew
			return h
		}
	}
	return LoadSourceHashes(path, root, began)
}

// Digest is the short digest explain records of a file's content.
func Digest(data []byte) string {
	sum := sha256.Sum256(data)
	return hex.EncodeToString(sum[:6])
}

// Prestat stats the files of the root that Hash will be asked for, on
// every CPU.
func (h *SourceHashes) Prestat(rels []string) {
	stats := make([]statResult, len(rels))
	var next atomic.Int64
	var wg sync.WaitGroup
	for range min(runtime.GOMAXPROCS(0), len(rels)) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := int(next.Add(1) - 1); i < len(rels); i = int(next.Add(1) - 1) {
				st, ok := StatPath(filepath.Join(h.root, rels[i]))
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

// Hash is the digest explain records for a file of the root.
func (h *SourceHashes) Hash(rel string) (string, error) {
	path := filepath.Join(h.root, rel)
	pre, taken := h.stats[rel]
	st, ok := pre.st, pre.ok
	if !taken {
		st, ok = StatPath(path)
	}
	if was, seen := h.was[rel]; ok && seen && st.Size >= 0 && was.Stat == st {
		h.now[rel] = was
		return was.Hash, nil
	}
	data, err := os.ReadFile(path)
	if err != nil {
		return "", err
	}
	f := hashedFile{Stat: st, Hash: Digest(data)}
	if ok {
		h.now[rel] = f
	} else {
		h.unsure = true
	}
	return f.Hash, nil
}

// Changed says whether a file hashed since the record was loaded no longer
// stats as it did when it was hashed: a build that read it in between may
// have read other bytes than those its key names.
func (h *SourceHashes) Changed() bool {
	if h.unsure {
		return true
	}
	rels := make([]string, 0, len(h.now))
	for rel := range h.now {
		rels = append(rels, rel)
	}
	var changed atomic.Bool
	var next atomic.Int64
	var wg sync.WaitGroup
	for range min(runtime.GOMAXPROCS(0), len(rels)) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := int(next.Add(1) - 1); i < len(rels) && !changed.Load(); i = int(next.Add(1) - 1) {
				if st, _ := StatPath(filepath.Join(h.root, rels[i])); st != h.now[rels[i]].Stat {
					changed.Store(true)
				}
			}
		}()
	}
	wg.Wait()
	return changed.Load()
}

// Save records this build's digests; a build that could not write it
// reads every file next time.
func (h *SourceHashes) Save() {
	atomicfile.Write(h.path, func(w io.Writer) error {
		return json.NewEncoder(w).Encode(sourceHashesRecord{RecordedAt: h.began, Files: h.now})
	})
}
