// Small tables erased inside the driver's JVM, compiled there by Janino (indriver.py): the key
// columns of a few small files are read, and the files holding requested rows rewritten, with
// Iceberg's generic Parquet readers and writers. A Spark query costs a fixed ~0.2-0.5 s of planning
// and scheduling on the driver whatever it reads; a small file costs milliseconds this way.
// The batch's key values arrive as JVM objects (never as command text) and no value leaves the JVM:
// answers name files, request ids and counts.
// Janino compiles Java with generics erased: raw types and explicit casts throughout.
package lakehouse_dsr;

import com.fasterxml.jackson.databind.ObjectMapper;
import java.util.ArrayList;
import java.util.Arrays;
import java.nio.ByteBuffer;
import java.nio.ByteOrder;
import java.nio.charset.StandardCharsets;
import java.util.HashSet;
import java.util.HashMap;
import java.util.Iterator;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.TreeSet;
import java.util.UUID;
import java.util.concurrent.atomic.AtomicLongArray;
import java.util.function.BiFunction;
import java.util.function.Function;
import javax.crypto.Mac;
import javax.crypto.spec.SecretKeySpec;
import org.apache.iceberg.ContentFile;
import org.apache.iceberg.DataFile;
import org.apache.iceberg.FileFormat;
import org.apache.iceberg.FileScanTask;
import org.apache.iceberg.PartitionField;
import org.apache.iceberg.PartitionSpec;
import org.apache.iceberg.Schema;
import org.apache.iceberg.StructLike;
import org.apache.iceberg.Table;
import org.apache.iceberg.TableProperties;
import org.apache.iceberg.data.GenericAppenderFactory;
import org.apache.iceberg.data.IdentityPartitionConverters;
import org.apache.iceberg.data.Record;
import org.apache.iceberg.data.parquet.GenericParquetReaders;
import org.apache.iceberg.deletes.PositionDelete;
import org.apache.iceberg.deletes.PositionDeleteWriter;
import org.apache.iceberg.expressions.Expression;
import org.apache.iceberg.io.CloseableIterable;
import org.apache.iceberg.io.CloseableIterator;
import org.apache.iceberg.io.DataWriter;
import org.apache.iceberg.io.OutputFileFactory;
import org.apache.iceberg.mapping.NameMappingParser;
import org.apache.iceberg.parquet.Parquet;
import org.apache.iceberg.relocated.com.google.common.hash.Hasher;
import org.apache.iceberg.relocated.com.google.common.hash.Hashing;
import org.apache.iceberg.shaded.org.apache.parquet.schema.MessageType;
import org.apache.iceberg.types.Type;
import org.apache.iceberg.types.Types;
import org.apache.iceberg.util.PartitionUtil;
import org.apache.spark.sql.Row;

public class InDriver {
  private final ObjectMapper json = new ObjectMapper();
  // What this JVM's driver-side work read and wrote, since it started (the counterpart of Spark's
  // task metrics): files opened, rows read, bytes of files read, rows written, bytes written.
  private final AtomicLongArray io = new AtomicLongArray(5);

  /** The counters above, as JSON [files, rows read, bytes read, rows written, bytes written]. */
  public String io() throws Exception {
    List out = new ArrayList();
    for (int i = 0; i < io.length(); i++) {
      out.add(Long.valueOf(io.get(i)));
    }
    return json.writeValueAsString(out);
  }

  public Keys keys() {
    return new Keys();
  }

  /** A table's key groups: each a top-level column, its lookup, and the columns a hit nulls. */
  public static class Keys {
    final List columns = new ArrayList();
    final List lookups = new ArrayList();
    final List redacted = new ArrayList();

    public Keys add(String column, Map lookup, List redact) {
      columns.add(column);
      lookups.add(lookup);
      redacted.add(new ArrayList(redact));
      return this;
    }
  }

  /** Why these tasks cannot be read here (null: they can): a file with deletes, a file format
   * other than Parquet, or a redacted column a partition is derived from. */
  public String refusal(Table table, List tasks, Keys keys) {
    for (int i = 0; i < tasks.size(); i++) {
      FileScanTask task = (FileScanTask) tasks.get(i);
      if (!task.deletes().isEmpty()) {
        return "a file has deletes";
      }
      if (task.file().format() != FileFormat.PARQUET) {
        return "a file is not Parquet";
      }
      PartitionSpec spec = (PartitionSpec) table.specs().get(Integer.valueOf(task.file().specId()));
      for (Iterator it = spec.fields().iterator(); it.hasNext(); ) {
        String source = table.schema().findColumnName(((PartitionField) it.next()).sourceId());
        for (int g = 0; g < keys.redacted.size(); g++) {
          for (Iterator r = ((List) keys.redacted.get(g)).iterator(); r.hasNext(); ) {
            if (((String) r.next()).equalsIgnoreCase(source)) {
              return "a partition is derived from a redacted column";
            }
          }
        }
      }
    }
    return null;
  }

  private static int position(Schema schema, String column) {
    List fields = schema.columns();
    for (int i = 0; i < fields.size(); i++) {
      if (((Types.NestedField) fields.get(i)).name().equalsIgnoreCase(column)) {
        return i;
      }
    }
    throw new IllegalArgumentException("no column " + column);
  }

  private CloseableIterable read(Table table, FileScanTask task, final Schema projection, Expression filter) {
    io.incrementAndGet(0);
    io.addAndGet(2, task.file().fileSizeInBytes());
    final Map constants = PartitionUtil.constantsMap(task, new BiFunction() {
      public Object apply(Object type, Object value) {
        return IdentityPartitionConverters.convertConstant((Type) type, value);
      }
    });
    Parquet.ReadBuilder builder = Parquet.read(table.io().newInputFile(task.file().location()))
        .project(projection)
        .createReaderFunc(new Function() {
          public Object apply(Object fileSchema) {
            return GenericParquetReaders.buildReader(projection, (MessageType) fileSchema, constants);
          }
        });
    String mapping = (String) table.properties().get("schema.name-mapping.default");
    if (mapping != null) {
      builder = builder.withNameMapping(NameMappingParser.fromJson(mapping));
    }
    if (filter != null) {  // skips row groups only: every row of the others is returned
      builder = builder.filter(filter);
    }
    return builder.build();
  }

  /** The sorted distinct ids of the requests naming `record` through any key group (null: none),
   * and in `hits` which groups named it. */
  private static TreeSet requests(Record record, int[] positions, Keys keys, boolean[] hits) {
    TreeSet ids = null;
    for (int g = 0; g < positions.length; g++) {
      Object value = record.get(positions[g]);
      List named = value == null ? null : (List) ((Map) keys.lookups.get(g)).get(value);
      hits[g] = named != null;
      if (named != null) {
        if (ids == null) {
          ids = new TreeSet();
        }
        ids.addAll(named);
      }
    }
    return ids;
  }

  /** The plan of the files of `tasks`: per file and combination of requests naming a row (none:
   * rows nobody asked about), the row count, as JSON [[file, [ids] or null, count], ...]. Reads the
   * key columns only, skipping row groups `filter` rules out. */
  public String plan(Table table, List tasks, Keys keys, Expression filter) throws Exception {
    Schema projection = table.schema().caseInsensitiveSelect(keys.columns);
    int[] positions = new int[keys.columns.size()];
    for (int g = 0; g < positions.length; g++) {
      positions[g] = position(projection, (String) keys.columns.get(g));
    }
    boolean[] hits = new boolean[positions.length];
    List out = new ArrayList();
    for (int i = 0; i < tasks.size(); i++) {
      FileScanTask task = (FileScanTask) tasks.get(i);
      Map counts = new LinkedHashMap();
      CloseableIterable rows = read(table, task, projection, filter);
      try {
        for (CloseableIterator it = rows.iterator(); it.hasNext(); ) {
          TreeSet ids = requests((Record) it.next(), positions, keys, hits);
          io.incrementAndGet(1);
          List group = ids == null ? null : new ArrayList(ids);
          Long n = (Long) counts.get(group);
          counts.put(group, Long.valueOf(n == null ? 1L : n.longValue() + 1L));
        }
      } finally {
        rows.close();
      }
      for (Iterator it = counts.keySet().iterator(); it.hasNext(); ) {
        Object group = it.next();
        List entry = new ArrayList();
        entry.add(task.file().location());
        entry.add(group);
        entry.add(counts.get(group));
        out.add(entry);
      }
    }
    return json.writeValueAsString(out);
  }

  /** Each key group's position in `schema` (into `positions`), and per group the positions of the
   * columns a hit sets to NULL. */
  private static List nulledPositions(Schema schema, Keys keys, int[] positions) {
    List nulled = new ArrayList();
    for (int g = 0; g < positions.length; g++) {
      positions[g] = position(schema, (String) keys.columns.get(g));
      List columns = (List) keys.redacted.get(g);
      int[] at = new int[columns.size()];
      for (int c = 0; c < at.length; c++) {
        at[c] = position(schema, (String) columns.get(c));
      }
      nulled.add(at);
    }
    return nulled;
  }

  /** A named row's columns as a redaction leaves them: each hit group's columns NULL. */
  private static void erase(Record record, boolean[] hits, List nulled) {
    for (int g = 0; g < hits.length; g++) {
      if (hits[g]) {
        int[] at = (int[]) nulled.get(g);
        for (int c = 0; c < at.length; c++) {
          record.set(at[c], null);
        }
      }
    }
  }

  /** The files of `tasks` rewritten as the erasure leaves their rows, one new file per old file
   * (none where no row is left), rows in the old file's order: a row a key group names is dropped
   * (`delete`) or has that group's columns set to NULL. Written like the table's own writers
   * (its properties: compression, metrics, bloom filters; its location provider), not committed:
   * the caller commits them or deletes them. Returns the new DataFiles. */
  public List rewrite(Table table, List tasks, Keys keys, boolean delete) throws Exception {
    Schema schema = table.schema();
    int[] positions = new int[keys.columns.size()];
    List nulled = nulledPositions(schema, keys, positions);
    boolean[] hits = new boolean[positions.length];
    String operation = "dsr-" + UUID.randomUUID();
    List written = new ArrayList();
    try {
      for (int i = 0; i < tasks.size(); i++) {
        FileScanTask task = (FileScanTask) tasks.get(i);
        DataFile file = (DataFile) task.file();
        PartitionSpec spec = (PartitionSpec) table.specs().get(Integer.valueOf(file.specId()));
        GenericAppenderFactory factory = new GenericAppenderFactory(table, schema, spec, table.properties(),
                                                                    null, null, null);
        OutputFileFactory names = OutputFileFactory.builderFor(table, i, 0L).format(FileFormat.PARQUET)
            .operationId(operation).build();
        DataWriter writer = null;
        CloseableIterable rows = read(table, task, schema, null);
        try {
          for (CloseableIterator it = rows.iterator(); it.hasNext(); ) {
            Record record = (Record) it.next();
            io.incrementAndGet(1);
            if (requests(record, positions, keys, hits) != null) {
              if (delete) {
                continue;
              }
              erase(record, hits, nulled);
            }
            if (writer == null) {
              writer = factory.newDataWriter(names.newOutputFile(spec, file.partition()), FileFormat.PARQUET,
                                             file.partition());
            }
            writer.write(record);
            io.incrementAndGet(3);
          }
        } finally {
          rows.close();
          if (writer != null) {
            writer.close();
            written.add(writer.toDataFile());
            io.addAndGet(4, writer.length());
          }
        }
      }
    } catch (Exception e) {
      deleteAll(table, written);  // nobody will commit them
      throw e;
    }
    return written;
  }

  private static void deleteAll(Table table, List files) {
    for (int i = 0; i < files.size(); i++) {
      table.io().deleteFile(((ContentFile) files.get(i)).location());
    }
  }

  /** Position delete files, one per data file: for the file at `locations[i]` (one of `tasks`'
   * files), the rows at positions `positions[i]` (little-endian 64-bit integers, ascending).
   * Written like the table's own delete writers (its delete file format, metrics and location
   * provider), each scoped to its one data file; not committed: the caller commits them (a row
   * delta) or deletes them. Reads nothing. Returns the DeleteFiles. */
  public List positionDeletes(Table table, List tasks, List locations, List positions) throws Exception {
    Map files = new HashMap();
    for (int i = 0; i < tasks.size(); i++) {
      DataFile file = (DataFile) ((FileScanTask) tasks.get(i)).file();
      files.put(file.location(), file);
    }
    Map properties = table.properties();
    FileFormat fileFormat = FileFormat.fromString((String) properties.getOrDefault(
        TableProperties.DELETE_DEFAULT_FILE_FORMAT, properties.getOrDefault(
            TableProperties.DEFAULT_FILE_FORMAT, TableProperties.DEFAULT_FILE_FORMAT_DEFAULT)));
    String operation = "dsr-" + UUID.randomUUID();
    List written = new ArrayList();
    try {
      for (int i = 0; i < locations.size(); i++) {
        String location = (String) locations.get(i);
        DataFile file = (DataFile) files.get(location);
        if (file == null) {
          throw new IllegalArgumentException("position deletes for a file that is not a candidate");
        }
        PartitionSpec spec = (PartitionSpec) table.specs().get(Integer.valueOf(file.specId()));
        GenericAppenderFactory factory = new GenericAppenderFactory(table, table.schema(), spec, properties,
                                                                    null, null, null);
        OutputFileFactory names = OutputFileFactory.builderFor(table, i, 0L).format(fileFormat)
            .operationId(operation).suffix("deletes").build();
        PositionDeleteWriter writer = factory.newPosDeleteWriter(names.newOutputFile(spec, file.partition()),
                                                                 fileFormat, file.partition());
        ByteBuffer at = ByteBuffer.wrap((byte[]) positions.get(i)).order(ByteOrder.LITTLE_ENDIAN);
        PositionDelete delete = PositionDelete.create();
        try {
          while (at.hasRemaining()) {
            writer.write(delete.set(location, at.getLong()));
            io.incrementAndGet(3);
          }
        } finally {
          writer.close();
        }
        written.add(writer.toDeleteFile());
        io.addAndGet(4, writer.length());
      }
    } catch (Exception e) {
      deleteAll(table, written);  // nobody will commit them
      throw e;
    }
    return written;
  }

  /** The collateral check's fingerprints of the files at `locations` (a JSON array) as snapshot
   * `snapshotId` holds them: [rows, wrapping sum of the first 64 bits of each row's hash, XOR of
   * the second 64] of the rows no key names, and of the named rows as the erasure must leave them
   * (nothing when `delete`, else each hit group's columns NULL). Every column of every row is
   * hashed (murmur3_128 over each value with its type and a null flag). Null when one of the files
   * has deletes or is not Parquet (the caller reads them with Spark), or is not in the snapshot. */
  public String fingerprint(Table table, long snapshotId, String locations, Keys keys, boolean delete)
      throws Exception {
    HashSet wanted = new HashSet((List) json.readValue(locations, List.class));
    List tasks = new ArrayList();
    CloseableIterable planned = table.newScan().useSnapshot(snapshotId).planFiles();
    try {
      for (CloseableIterator it = planned.iterator(); it.hasNext(); ) {
        FileScanTask task = (FileScanTask) it.next();
        if (wanted.remove(task.file().location())) {
          tasks.add(task);
        }
      }
    } finally {
      planned.close();
    }
    if (!wanted.isEmpty() || refusal(table, tasks, keys) != null) {
      return null;
    }
    Schema schema = table.schema();
    int[] positions = new int[keys.columns.size()];
    List nulled = nulledPositions(schema, keys, positions);
    boolean[] hits = new boolean[positions.length];
    long[] others = new long[3];
    long[] requested = new long[3];
    for (int i = 0; i < tasks.size(); i++) {
      CloseableIterable rows = read(table, (FileScanTask) tasks.get(i), schema, null);
      try {
        for (CloseableIterator it = rows.iterator(); it.hasNext(); ) {
          Record record = (Record) it.next();
          io.incrementAndGet(1);
          if (requests(record, positions, keys, hits) == null) {
            add(others, record);
          } else if (!delete) {
            erase(record, hits, nulled);
            add(requested, record);
          }
        }
      } finally {
        rows.close();
      }
    }
    List out = new ArrayList();
    out.add(asList(others));
    out.add(asList(requested));
    return json.writeValueAsString(out);
  }

  private static List asList(long[] values) {
    List out = new ArrayList();
    for (int i = 0; i < values.length; i++) {
      out.add(Long.valueOf(values[i]));
    }
    return out;
  }

  private static void add(long[] fingerprint, Record record) {
    Hasher hasher = Hashing.murmur3_128().newHasher();
    feed(hasher, record);
    ByteBuffer hash = ByteBuffer.wrap(hasher.hash().asBytes());
    fingerprint[0] += 1;
    fingerprint[1] += hash.getLong(0);
    fingerprint[2] ^= hash.getLong(8);
  }

  /** A value into the hash, tagged by kind, so that neither NULL nor a shifted value passes for another. */
  private static void feed(Hasher hasher, Object value) {
    if (value == null) {
      hasher.putByte((byte) 0);
    } else if (value instanceof StructLike) {
      StructLike struct = (StructLike) value;
      hasher.putByte((byte) 1);
      hasher.putInt(struct.size());
      for (int i = 0; i < struct.size(); i++) {
        feed(hasher, struct.get(i, Object.class));
      }
    } else if (value instanceof List) {
      List list = (List) value;
      hasher.putByte((byte) 2);
      hasher.putInt(list.size());
      for (int i = 0; i < list.size(); i++) {
        feed(hasher, list.get(i));
      }
    } else if (value instanceof Map) {
      Map map = (Map) value;
      hasher.putByte((byte) 3);
      hasher.putInt(map.size());
      long entries = 0L;  // order-free: a map's entries come in no fixed order
      for (Iterator it = map.entrySet().iterator(); it.hasNext(); ) {
        Map.Entry entry = (Map.Entry) it.next();
        Hasher one = Hashing.murmur3_128().newHasher();
        feed(one, entry.getKey());
        feed(one, entry.getValue());
        entries += one.hash().asLong();
      }
      hasher.putLong(entries);
    } else if (value instanceof ByteBuffer) {
      hasher.putByte((byte) 4);
      hasher.putBytes((ByteBuffer) ((ByteBuffer) value).duplicate());
    } else if (value instanceof byte[]) {
      hasher.putByte((byte) 4);
      hasher.putBytes((byte[]) value);
    } else {
      hasher.putByte((byte) 5);
      hasher.putString(value.getClass().getName(), StandardCharsets.UTF_8);
      hasher.putString(value.toString(), StandardCharsets.UTF_8);
    }
  }

  /** The ledger's hashes and the keys that made them, for liveFound: `storedJson` is [[request id,
   * identifier, hex hash, id of the key that made it or null], ...]; `keyRows` are Spark rows
   * (key id, hex key), so no key crosses Py4J as command text. */
  public HashLookup hashLookup(String storedJson, List keyRows) throws Exception {
    HashLookup lookup = new HashLookup();
    List rows = (List) json.readValue(storedJson, List.class);
    for (int i = 0; i < rows.size(); i++) {
      List row = (List) rows.get(i);
      List entries = (List) lookup.stored.get(row.get(2));
      if (entries == null) {
        entries = new ArrayList();
        lookup.stored.put(row.get(2), entries);
      }
      entries.add(row);
    }
    for (int i = 0; i < keyRows.size(); i++) {
      Row row = (Row) keyRows.get(i);
      lookup.keys.put(row.getString(0), hex(row.getString(1)));
    }
    return lookup;
  }

  public static class HashLookup {
    final Map stored = new HashMap();  // hex hash -> [[request id, identifier, hex hash, key id], ...]
    final Map keys = new LinkedHashMap();  // key id -> key bytes
  }

  /** The live check by keyed hash over the files of `tasks`: every key column's value (as text, as
   * Spark casts it) is hashed with HMAC-SHA256 under each key of `lookup` and looked up among its
   * stored hashes of the column's identifier (a hash whose key id is known is matched under that key
   * only). Answers {request id: rows}, a value found for one request under two keys counted once, as
   * verify.find_hashed counts. Reads the key columns only, skipping row groups `filter` rules out. */
  public String liveFound(Table table, List tasks, List columns, List identifiers, HashLookup lookup,
                          Expression filter) throws Exception {
    Map stored = lookup.stored;
    Map keys = lookup.keys;
    Schema projection = table.schema().caseInsensitiveSelect(columns);
    int[] positions = new int[columns.size()];
    List counts = new ArrayList();  // per key column: value text -> rows
    for (int g = 0; g < positions.length; g++) {
      positions[g] = position(projection, (String) columns.get(g));
      counts.add(new HashMap());
    }
    for (int i = 0; i < tasks.size(); i++) {
      CloseableIterable read = read(table, (FileScanTask) tasks.get(i), projection, filter);
      try {
        for (CloseableIterator it = read.iterator(); it.hasNext(); ) {
          Record record = (Record) it.next();
          io.incrementAndGet(1);
          for (int g = 0; g < positions.length; g++) {
            Object value = record.get(positions[g]);
            if (value != null) {
              Map perValue = (Map) counts.get(g);
              Long n = (Long) perValue.get(value.toString());
              perValue.put(value.toString(), Long.valueOf(n == null ? 1L : n.longValue() + 1L));
            }
          }
        }
      } finally {
        read.close();
      }
    }
    Map found = new HashMap();  // request id -> rows
    HashSet counted = new HashSet();  // (request id, key column, value) counted once
    for (Iterator k = keys.keySet().iterator(); k.hasNext(); ) {
      String keyId = (String) k.next();
      Mac mac = Mac.getInstance("HmacSHA256");
      mac.init(new SecretKeySpec((byte[]) keys.get(keyId), "HmacSHA256"));
      for (int g = 0; g < positions.length; g++) {
        Map perValue = (Map) counts.get(g);
        for (Iterator v = perValue.keySet().iterator(); v.hasNext(); ) {
          String value = (String) v.next();
          List entries = (List) stored.get(hex(mac.doFinal(value.getBytes(StandardCharsets.UTF_8))));
          for (int e = 0; entries != null && e < entries.size(); e++) {
            List entry = (List) entries.get(e);
            boolean sameKey = entry.get(3) == null || keyId.equals(entry.get(3));
            if (sameKey && identifiers.get(g).equals(entry.get(1))
                && counted.add(Arrays.asList(new Object[] {entry.get(0), Integer.valueOf(g), value}))) {
              Long n = (Long) found.get(entry.get(0));
              long add = ((Long) perValue.get(value)).longValue();
              found.put(entry.get(0), Long.valueOf(n == null ? add : n.longValue() + add));
            }
          }
        }
      }
    }
    return json.writeValueAsString(found);
  }

  private static byte[] hex(String text) {
    byte[] out = new byte[text.length() / 2];
    for (int i = 0; i < out.length; i++) {
      out[i] = (byte) Integer.parseInt(text.substring(2 * i, 2 * i + 2), 16);
    }
    return out;
  }

  private static String hex(byte[] bytes) {
    StringBuilder out = new StringBuilder();
    for (int i = 0; i < bytes.length; i++) {
      out.append(Character.forDigit((bytes[i] >> 4) & 15, 16)).append(Character.forDigit(bytes[i] & 15, 16));
    }
    return out.toString();
  }
}
