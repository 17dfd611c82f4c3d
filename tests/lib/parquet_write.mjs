// Writes Parquet files for tests/scripts/parquet.py with two writers that are not fsdp.c's reader:
// hyparquet-writer (data pages v2, dictionary on or off, Snappy/gzip/Zstd/none) and parquetjs-lite (data
// pages v1 or v2, PLAIN, Snappy/gzip/none). Usage: node parquet_write.mjs MODULES_DIR < spec.json, where
// MODULES_DIR holds node_modules/ with both packages and spec.json is a list of
//   {"file": PATH, "writer": "hyparquet"|"parquetjs", "codec": "SNAPPY"|"GZIP"|"ZSTD"|"UNCOMPRESSED",
//    "dictionary": bool, "page_v2": bool, "row_group": ROWS, "columns": {NAME: [string|null, ...]},
//    "ints": {NAME: [int, ...]} }
// gzip comes from Node's zlib, Zstd from the zstd program (hyparquet-writer takes codecs as functions);
// LZ4_RAW is a label only, for the test of a codec fsdp.c refuses.
import { execFileSync } from 'node:child_process'
import { readFileSync } from 'node:fs'
import { createRequire } from 'node:module'
import path from 'node:path'
import { pathToFileURL } from 'node:url'
import zlib from 'node:zlib'

const modules = path.resolve(process.argv[2])
const require = createRequire(path.join(modules, 'package.json'))
const { parquetWriteFile } = await import(pathToFileURL(path.join(modules, 'node_modules/hyparquet-writer/src/node.js')))
const parquet = require('parquetjs-lite')

const compressors = {
  GZIP: (bytes) => new Uint8Array(zlib.gzipSync(bytes)),
  ZSTD: (bytes) => new Uint8Array(execFileSync('zstd', ['-q', '-c', '-3'], { input: bytes })),
  // a codec fsdp.c refuses: the pages are left as they are, only the footer names it
  LZ4_RAW: (bytes) => bytes,
}

async function writeParquetjs(spec) {
  const fields = {}
  for (const name of Object.keys(spec.columns)) {
    fields[name] = { type: 'UTF8', optional: spec.columns[name].includes(null), compression: spec.codec }
  }
  for (const name of Object.keys(spec.ints || {})) fields[name] = { type: 'INT64', compression: spec.codec }
  const writer = await parquet.ParquetWriter.openFile(new parquet.ParquetSchema(fields), spec.file,
    { useDataPageV2: spec.page_v2, rowGroupSize: spec.row_group })
  const rows = Object.values(spec.columns)[0].length
  for (let i = 0; i < rows; i++) {
    const row = {}
    for (const [name, values] of Object.entries(spec.columns)) if (values[i] !== null) row[name] = values[i]
    for (const [name, values] of Object.entries(spec.ints || {})) row[name] = values[i]
    await writer.appendRow(row)
  }
  await writer.close()
}

function writeHyparquet(spec) {
  const columnData = Object.entries(spec.columns).map(([name, data]) => ({
    name, data, type: 'STRING', nullable: data.includes(null), encoding: spec.dictionary ? 'RLE_DICTIONARY' : 'PLAIN',
  }))
  for (const [name, data] of Object.entries(spec.ints || {})) {
    columnData.push({ name, data: data.map(BigInt), type: 'INT64', nullable: false })
  }
  parquetWriteFile({ filename: spec.file, columnData, codec: spec.codec, compressors, rowGroupSize: spec.row_group,
    pageSize: spec.page_size || 1 << 20 })
}

for (const spec of JSON.parse(readFileSync(0, 'utf8'))) {
  if (spec.writer === 'parquetjs') await writeParquetjs(spec)
  else writeHyparquet(spec)
}
