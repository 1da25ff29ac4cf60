package fetch

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"strconv"
)

// journalHeader identifies what a partial file is a part of. A journal whose
// header differs (the object changed, or the chunk size did) is discarded.
type journalHeader struct {
	Size      int64  `json:"size"`
	ETag      string `json:"etag"`
	ChunkSize int64  `json:"chunkSize"`
}

// journal is the sidecar of a partial file: a JSON header line, then one line
// per completed chunk index. Lines are appended only after the data file has
// been synced, so a chunk in the journal is a chunk on disk.
type journal struct {
	f *os.File
}

// openJournal returns the journal at path and the chunks it records as done,
// starting a new one (and reporting fresh) when it is missing or does not
// match hdr. A torn last line, from a crash mid-append, is ignored.
func openJournal(path string, hdr journalHeader, chunks int) (j *journal, done []bool, fresh bool, err error) {
	done = make([]bool, chunks)
	data, err := os.ReadFile(path)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		fresh = true
	case err != nil:
		return nil, nil, false, fmt.Errorf("read journal %s: %w", path, err)
	default:
		fresh = !parseJournal(data, hdr, done)
	}
	if fresh {
		clear(done)
		line, err := json.Marshal(hdr)
		if err != nil {
			return nil, nil, false, fmt.Errorf("encode journal header: %w", err)
		}
		if err := os.WriteFile(path, append(line, '\n'), 0o644); err != nil {
			return nil, nil, false, fmt.Errorf("write journal %s: %w", path, err)
		}
	}
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		return nil, nil, false, fmt.Errorf("open journal %s: %w", path, err)
	}
	return &journal{f: f}, done, fresh, nil
}

// parseJournal fills done and reports whether data is a journal for hdr.
func parseJournal(data []byte, hdr journalHeader, done []bool) bool {
	sc := bufio.NewScanner(bytes.NewReader(data))
	if !sc.Scan() {
		return false
	}
	var got journalHeader
	if err := json.Unmarshal(sc.Bytes(), &got); err != nil || got != hdr {
		return false
	}
	// Only complete lines count: bufio.Scanner also returns a final line
	// without its newline, which may be torn.
	complete := bytes.LastIndexByte(data, '\n') + 1
	off := len(sc.Bytes()) + 1
	for sc.Scan() {
		off += len(sc.Bytes()) + 1
		if off > complete {
			break
		}
		i, err := strconv.Atoi(sc.Text())
		if err != nil || i < 0 || i >= len(done) {
			return false
		}
		done[i] = true
	}
	return true
}

// append records chunks as done and syncs the journal.
func (j *journal) append(chunks []int) error {
	var b []byte
	for _, c := range chunks {
		b = strconv.AppendInt(b, int64(c), 10)
		b = append(b, '\n')
	}
	if _, err := j.f.Write(b); err != nil {
		return fmt.Errorf("append to journal: %w", err)
	}
	if err := j.f.Sync(); err != nil {
		return fmt.Errorf("sync journal: %w", err)
	}
	return nil
}

func (j *journal) close() error { return j.f.Close() }
