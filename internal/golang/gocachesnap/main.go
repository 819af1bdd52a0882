// Command gocachesnap moves Go build cache entries between the BuildKit
// cache mount kiln compiles with and a plain directory. kiln builds it inside
// BuildKit with the pinned toolchain and runs it in two steps:
//
//	gocachesnap snapshot SPEC OUT  copies the entries the build's packages use
//	gocachesnap seed SRC GOCACHE   adds a verified snapshot's entries
//
// It uses the standard library only, so that it compiles quickly.
package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
)

// Spec says which go commands find the entries to snapshot.
type Spec struct {
	GoCache string `json:"gocache"`
	// Max is the largest snapshot in bytes.
	Max  int64 `json:"max"`
	Runs []struct {
		Env  []string `json:"env"`
		Args []string `json:"args"`
	} `json:"runs"`
}

func main() {
	var err error
	switch {
	case len(os.Args) == 4 && os.Args[1] == "snapshot":
		err = snapshot(os.Args[2], os.Args[3])
	case len(os.Args) == 4 && os.Args[1] == "seed":
		err = seed(os.Args[2], os.Args[3])
	default:
		err = fmt.Errorf("usage: gocachesnap snapshot SPEC OUT | seed SRC GOCACHE")
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "gocachesnap:", err)
		os.Exit(1)
	}
}

// snapshot runs each go command with GODEBUG=gocachehash=1, which prints
// the action ID of every package it builds or finds cached, and copies the
// action entry (-a) and output entry (-d) of each.
func snapshot(specFile, out string) error {
	dt, err := os.ReadFile(specFile)
	if err != nil {
		return err
	}
	var spec Spec
	if err := json.Unmarshal(dt, &spec); err != nil {
		return err
	}
	ids := map[string]bool{}
	for _, run := range spec.Runs {
		var stderr bytes.Buffer
		cmd := exec.Command(run.Args[0], run.Args[1:]...)
		cmd.Env = append(run.Env, "GODEBUG=gocachehash=1")
		cmd.Stdout, cmd.Stderr = os.Stdout, &stderr
		if err := cmd.Run(); err != nil {
			return fmt.Errorf("%s: %v\n%s", strings.Join(run.Args, " "), err, lastLines(stderr.String(), 20))
		}
		sc := bufio.NewScanner(&stderr)
		sc.Buffer(make([]byte, 1<<20), 1<<20)
		for sc.Scan() {
			line := sc.Text()
			if !strings.HasPrefix(line, "HASH[build ") {
				continue
			}
			if i := strings.LastIndex(line, "]: "); i > 0 && isID(line[i+3:]) {
				ids[line[i+3:]] = true
			}
		}
	}
	sorted := make([]string, 0, len(ids))
	for id := range ids {
		sorted = append(sorted, id)
	}
	sort.Strings(sorted)
	var total int64
	entries := 0
	for _, id := range sorted {
		action := filepath.Join(spec.GoCache, id[:2], id+"-a")
		dt, err := os.ReadFile(action)
		if err != nil {
			continue // not cached: nothing to carry
		}
		f := strings.Fields(string(dt))
		if len(f) < 3 || !isID(f[2]) {
			continue
		}
		output := filepath.Join(spec.GoCache, f[2][:2], f[2]+"-d")
		n, err := copyFile(output, filepath.Join(out, f[2][:2], f[2]+"-d"))
		if err != nil {
			continue // an action without its output is of no use
		}
		if _, err := copyFile(action, filepath.Join(out, id[:2], id+"-a")); err != nil {
			return err
		}
		total += n + int64(len(dt))
		entries++
		if spec.Max > 0 && total > spec.Max {
			return fmt.Errorf("the Go cache snapshot passed its cap of %d bytes after %d of %d entries; raise cache.gocacheMax in build/kiln.yaml", spec.Max, entries, len(sorted))
		}
	}
	fmt.Printf("snapshot: %d entries, %d bytes, of %d packages\n", entries, total, len(sorted))
	return nil
}

// seed copies the entries GOCACHE lacks; kiln verified them beforehand.
func seed(src, gocache string) error {
	added, present := 0, 0
	err := filepath.Walk(src, func(path string, fi os.FileInfo, err error) error {
		if err != nil || !fi.Mode().IsRegular() {
			return err
		}
		rel, _ := filepath.Rel(src, path)
		dest := filepath.Join(gocache, rel)
		if _, err := os.Stat(dest); err == nil {
			present++
			return nil
		}
		tmp := dest + ".seed"
		if _, err := copyFile(path, tmp); err != nil {
			return err
		}
		added++
		return os.Rename(tmp, dest)
	})
	fmt.Printf("seed: %d entries added, %d already present\n", added, present)
	return err
}

func isID(s string) bool {
	if len(s) != 64 {
		return false
	}
	for _, c := range s {
		if !('0' <= c && c <= '9' || 'a' <= c && c <= 'f') {
			return false
		}
	}
	return true
}

// copyFile writes a fresh file (a current mtime keeps go's cache trimming
// from deleting it early) and returns its size.
func copyFile(src, dest string) (int64, error) {
	in, err := os.Open(src)
	if err != nil {
		return 0, err
	}
	defer in.Close()
	if err := os.MkdirAll(filepath.Dir(dest), 0o777); err != nil {
		return 0, err
	}
	out, err := os.OpenFile(dest, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o666)
	if err != nil {
		return 0, err
	}
	n, err := io.Copy(out, in)
	if cerr := out.Close(); err == nil {
		err = cerr
	}
	return n, err
}

func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}
