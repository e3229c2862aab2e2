// An auditor's check of an opledger log written against Go's own transparency-log packages
// (golang.org/x/mod/sumdb/note and golang.org/x/mod/sumdb/tlog), not against opledger's code: it
// opens the served checkpoint and a kept earlier one with the log's verifier key, reads the
// served hash tiles through tlog.TileHashReader (which authenticates every tile against the
// signed tree head), checks the served consistency proof from the kept checkpoint with
// tlog.CheckTree, and for each event of an `opledger export` builds its leaf from the book's
// leaf encoding (docs/src/auditors/transparency-log.md) and checks the served inclusion proof
// with tlog.CheckRecord and against the tiles.
//
// Usage: go run main.go -url URL -vkey VERIFIER_KEY -kept CHECKPOINT_FILE -export EXPORT.ndjson
// Exit 0 with a summary when everything holds; 1 naming the first thing that does not.
package main

import (
	"bufio"
	"bytes"
	"encoding/base64"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"strconv"
	"strings"

	"golang.org/x/mod/sumdb/note"
	"golang.org/x/mod/sumdb/tlog"
)

func fail(format string, args ...interface{}) {
	fmt.Fprintf(os.Stderr, "tlog check failed: "+format+"\n", args...)
	os.Exit(1)
}

// checkpoint opens a C2SP tlog-checkpoint signed by the verifier key: origin, size and base64
// root hash on three lines (tlog.ParseTree reads only the checksum database's own origin).
func checkpoint(msg []byte, verifiers note.Verifiers, origin string) tlog.Tree {
	n, err := note.Open(msg, verifiers)
	if err != nil {
		fail("the checkpoint does not open with the verifier key: %v", err)
	}
	lines := strings.SplitN(n.Text, "\n", 4)
	if len(lines) < 4 || lines[0] != origin {
		fail("the checkpoint's first line is not the key's name %q: %q", origin, n.Text)
	}
	size, err := strconv.ParseInt(lines[1], 10, 64)
	if err != nil || size < 0 || strconv.FormatInt(size, 10) != lines[1] {
		fail("the checkpoint's size %q is not a decimal number", lines[1])
	}
	hash, err := tlog.ParseHash(lines[2])
	if err != nil {
		fail("the checkpoint's root hash %q: %v", lines[2], err)
	}
	return tlog.Tree{N: size, Hash: hash}
}

func get(url string) []byte {
	response, err := http.Get(url)
	if err != nil {
		fail("GET %s: %v", url, err)
	}
	defer response.Body.Close()
	body, err := io.ReadAll(response.Body)
	if err != nil || response.StatusCode != 200 {
		fail("GET %s: %d %s %v", url, response.StatusCode, body, err)
	}
	return body
}

// tiles reads the served hash tiles; Go names them tile/8/L/N, C2SP (and opledger) tile/L/N.
type tiles struct{ base string }

func (t tiles) Height() int { return 8 }
func (t tiles) ReadTiles(list []tlog.Tile) ([][]byte, error) {
	out := make([][]byte, len(list))
	for i, tile := range list {
		out[i] = get(t.base + "/v1/log/tile/" + strings.TrimPrefix(tile.Path(), "tile/8/"))
	}
	return out, nil
}
func (t tiles) SaveTiles([]tlog.Tile, [][]byte) {}

func hashes(texts []string) []tlog.Hash {
	out := make([]tlog.Hash, len(texts))
	for i, text := range texts {
		hash, err := tlog.ParseHash(text)
		if err != nil {
			fail("a proof hash %q: %v", text, err)
		}
		out[i] = hash
	}
	return out
}

type event struct {
	Position       int64   `json:"position"`
	Stream         string  `json:"stream"`
	Version        uint64  `json:"version"`
	EventID        string  `json:"event_id"`
	Type           string  `json:"type"`
	Data           *string `json:"data"`
	DataBase64     *string `json:"data_base64"`
	Metadata       *string `json:"metadata"`
	MetadataBase64 *string `json:"metadata_base64"`
}

func stored(text, encoded *string, what string, position int64) []byte {
	if text != nil {
		return []byte(*text)
	}
	if encoded != nil {
		raw, err := base64.StdEncoding.DecodeString(*encoded)
		if err == nil {
			return raw
		}
	}
	fail("the event at position %d has no %s", position, what)
	return nil
}

// leaf is the book's leaf encoding: a tag, then position, stream, version, event id, type, data
// and metadata, integers big-endian, strings and bytes after their lengths.
func leaf(e event) []byte {
	var out bytes.Buffer
	out.WriteString("opledger-leaf-v1\x00")
	binary.Write(&out, binary.BigEndian, uint64(e.Position))
	binary.Write(&out, binary.BigEndian, uint16(len(e.Stream)))
	out.WriteString(e.Stream)
	binary.Write(&out, binary.BigEndian, e.Version)
	id, err := hex.DecodeString(strings.ReplaceAll(e.EventID, "-", ""))
	if err != nil || len(id) != 16 {
		fail("the event id %q at position %d is not a UUID", e.EventID, e.Position)
	}
	out.Write(id)
	binary.Write(&out, binary.BigEndian, uint16(len(e.Type)))
	out.WriteString(e.Type)
	data := stored(e.Data, e.DataBase64, "data", e.Position)
	binary.Write(&out, binary.BigEndian, uint32(len(data)))
	out.Write(data)
	metadata := stored(e.Metadata, e.MetadataBase64, "metadata", e.Position)
	binary.Write(&out, binary.BigEndian, uint32(len(metadata)))
	out.Write(metadata)
	return out.Bytes()
}

func main() {
	url := flag.String("url", "", "the served log's base URL")
	vkey := flag.String("vkey", "", "the log's verifier key")
	kept := flag.String("kept", "", "a checkpoint kept earlier")
	export := flag.String("export", "", "an opledger export (NDJSON)")
	flag.Parse()

	verifier, err := note.NewVerifier(*vkey)
	if err != nil {
		fail("the verifier key: %v", err)
	}
	verifiers := note.VerifierList(verifier)
	keptText, err := os.ReadFile(*kept)
	if err != nil {
		fail("%v", err)
	}
	old := checkpoint(keptText, verifiers, verifier.Name())
	latest := checkpoint(get(*url+"/v1/log/checkpoint"), verifiers, verifier.Name())

	// Every tile read is checked against the signed tree head by the reader itself.
	reader := tlog.TileHashReader(latest, tiles{*url})
	root, err := tlog.TreeHash(latest.N, reader)
	if err != nil || root != latest.Hash {
		fail("the served tiles do not make the checkpoint's root: %v", err)
	}

	var consistency struct {
		Proof []string `json:"consistency_proof"`
	}
	served := get(fmt.Sprintf("%s/v1/log/proof/consistency?from=%d&to=%d", *url, old.N, latest.N))
	if err := json.Unmarshal(served, &consistency); err != nil {
		fail("the consistency proof: %v", err)
	}
	if err := tlog.CheckTree(hashes(consistency.Proof), latest.N, latest.Hash, old.N, old.Hash); err != nil {
		fail("the checkpoint of %d events does not extend the kept one of %d: %v", latest.N, old.N, err)
	}

	file, err := os.Open(*export)
	if err != nil {
		fail("%v", err)
	}
	lines := bufio.NewScanner(file)
	lines.Buffer(make([]byte, 1<<20), 8<<20)
	included := 0
	for lines.Scan() {
		var e event
		if err := json.Unmarshal(lines.Bytes(), &e); err != nil {
			fail("an export line: %v", err)
		}
		if e.Position == 0 || e.Position > latest.N {
			continue // the header, the closing line, or an event past the checkpoint
		}
		index := e.Position - 1
		leafHash := tlog.RecordHash(leaf(e))
		var inclusion struct {
			Proof []string `json:"inclusion_proof"`
		}
		body := get(fmt.Sprintf("%s/v1/log/proof/inclusion?position=%d&size=%d", *url, e.Position, latest.N))
		if err := json.Unmarshal(body, &inclusion); err != nil {
			fail("the inclusion proof of position %d: %v", e.Position, err)
		}
		if err := tlog.CheckRecord(hashes(inclusion.Proof), latest.N, latest.Hash, index, leafHash); err != nil {
			fail("the event at position %d is not in the checkpoint of %d events: %v", e.Position, latest.N, err)
		}
		fromTiles, err := reader.ReadHashes([]int64{tlog.StoredHashIndex(0, index)})
		if err != nil || fromTiles[0] != leafHash {
			fail("the event at position %d is not the leaf in the served tiles: %v", e.Position, err)
		}
		included++
	}
	if err := lines.Err(); err != nil {
		fail("reading the export: %v", err)
	}
	fmt.Printf("checkpoint %d signed by %s; consistent with the kept checkpoint %d; %d events included\n",
		latest.N, verifier.Name(), old.N, included)
}
