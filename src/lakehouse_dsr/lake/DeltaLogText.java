// The actions of a Delta table's log files, read in the driver's JVM: only paths, deletion-vector
// flags and row counts cross into Python, never a statistic (a key's prefix) nor another writer's
// predicate; and a version's live files, replayed from its checkpoint and the commits since. A log
// holds a few small files between checkpoints, so a Spark job per question (file listing, task
// scheduling, a collect; Delta's own replay shuffles the actions by path) cost more than the reading.
// Compiled at run time by lake/bridge.py (Janino); see DeltaTable._actions and DeltaTable._adds.
package lakehouse_dsr;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;
import java.io.BufferedReader;
import java.io.InputStreamReader;
import java.nio.charset.StandardCharsets;
import com.fasterxml.jackson.databind.node.ObjectNode;
import java.util.ArrayList;
import java.util.LinkedHashMap;
import java.util.Iterator;
import java.util.List;
import java.util.Map;
import java.util.concurrent.Callable;
import java.util.concurrent.ExecutorService;
import java.util.concurrent.Executors;
import java.util.concurrent.Future;
import org.apache.hadoop.conf.Configuration;
import org.apache.hadoop.fs.FileSystem;
import org.apache.hadoop.fs.FileStatus;
import org.apache.hadoop.fs.Path;
import org.apache.parquet.example.data.Group;
import org.apache.parquet.hadoop.ParquetFileReader;
import org.apache.parquet.hadoop.ParquetReader;
import org.apache.parquet.hadoop.api.ReadSupport;
import org.apache.parquet.hadoop.example.GroupReadSupport;
import org.apache.parquet.hadoop.util.HadoopInputFile;
import org.apache.parquet.schema.GroupType;
import org.apache.parquet.schema.LogicalTypeAnnotation;
import org.apache.parquet.schema.MessageType;
import org.apache.parquet.schema.PrimitiveType;
import org.apache.parquet.schema.Type;
import org.apache.spark.sql.delta.Snapshot;

public class DeltaLogText {
    private static final ObjectMapper JSON = new ObjectMapper();
    // Object stores answer each file in tens of milliseconds: a few in flight at once.
    private static final int READERS = 8;

    /**
     * [[file index, kind, path, carries a deletion vector, numRecords or null]] of every action of
     * `kinds` (add, remove, cdc, sidecar) in `files` (JSON commits, checkpoints JSON or Parquet), as
     * JSON, in file order. The files are read whole, `READERS` at a time; a missing one fails the call.
     */
    public String actions(final List files, final List kinds, final Configuration conf) throws Exception {
        List read = readAll(files, kinds, conf);
        List out = new ArrayList();
        for (int i = 0; i < read.size(); i++) {
            List found = (List) read.get(i);
            if (found == null) {
                throw new IllegalStateException("a checkpoint keeps its statistics only as a struct: " + files.get(i));
            }
            for (int j = 0; j < found.size(); j++) {
                Object[] action = (Object[]) found.get(j);
                JsonNode body = (JsonNode) action[1];
                JsonNode vector = body.get("deletionVector");
                out.add(new Object[] {Integer.valueOf(i), action[0], body.get("path").asText(),
                    Boolean.valueOf(vector != null && !vector.isNull()), records(body)});
            }
        }
        return JSON.writeValueAsString(out);
    }

    /** The file indexes of the checkpoint `provider` reads (sidecars included): Delta 3 names them
     *  `allActionsFileIndexes()`, Delta 4 pairs each with its schema (and names the method on the
     *  provider's implementations only), so the method is found on the object at hand. */
    private static List checkpointIndexes(Object provider, Object log) throws Exception {
        java.lang.reflect.Method plain = null;
        try {
            plain = provider.getClass().getMethod("allActionsFileIndexes", new Class[0]);
        } catch (NoSuchMethodException e) {
            // Delta 4: below
        }
        if (plain != null) {
            return scala.collection.JavaConverters.seqAsJavaList((scala.collection.Seq) plain.invoke(provider, new Object[0]));
        }
        if (((org.apache.spark.sql.delta.UninitializedCheckpointProvider) provider).version() < 0) {
            return new ArrayList();  // no checkpoint yet (Delta 4's empty provider names neither method)
        }
        java.lang.reflect.Method paired = provider.getClass().getMethod("allActionsFileIndexesAndSchemas",
            new Class[] {org.apache.spark.sql.SparkSession.class, org.apache.spark.sql.delta.DeltaLog.class});
        List pairs = scala.collection.JavaConverters.seqAsJavaList(
            (scala.collection.Seq) paired.invoke(provider, new Object[] {org.apache.spark.sql.SparkSession.active(), log}));
        List out = new ArrayList();
        for (int i = 0; i < pairs.size(); i++) {
            out.add(((scala.Tuple2) pairs.get(i))._1());
        }
        return out;
    }

    /**
     * The `add` actions (AddFile, paths canonical as Delta's own replay spells them) of the files live
     * in `snapshot` (a Delta Snapshot of the table `log`), replayed here from the files Delta's replay
     * reads: its checkpoint (Parquet or JSON, sidecars included) and the JSON commits since. A `remove`
     * cancels the `add` of the same file and deletion vector; a later `add` replaces it. Null when
     * those files exceed `maxBytes` (the list would crowd the driver: Delta's replay in Spark serves
     * that table) or a checkpoint keeps statistics only as a struct (`stats_parsed`).
     */
    public List liveFiles(Object log, Object snapshot, long maxBytes, Configuration conf) throws Exception {
        Snapshot at = (Snapshot) snapshot;
        if (at.checkpointProvider().effectiveCheckpointSizeInBytes() + at.deltaFileSizeInBytes() > maxBytes) {
            return null;
        }
        List checkpoint = new ArrayList();
        List indexes = checkpointIndexes(at.checkpointProvider(), log);
        for (int i = 0; i < indexes.size(); i++) {
            FileStatus[] parts = ((org.apache.spark.sql.delta.DeltaLogFileIndex) indexes.get(i)).files();
            for (int j = 0; j < parts.length; j++) {
                checkpoint.add(parts[j].getPath().toString());
            }
        }
        List commits = new ArrayList();
        List deltas = scala.collection.JavaConverters.seqAsJavaList(at.logSegment().deltas());
        for (int i = 0; i < deltas.size(); i++) {
            commits.add(((FileStatus) deltas.get(i)).getPath().toString());
        }
        // A checkpoint's removes are tombstones of files gone before it: only its adds are read.
        List read = readAll(checkpoint, java.util.Arrays.asList(new Object[] {"add"}), conf);
        read.addAll(readAll(commits, java.util.Arrays.asList(new Object[] {"add", "remove"}), conf));
        scala.Function1 canonical = ((org.apache.spark.sql.delta.DeltaLog) log).getCanonicalPathFunction(false);
        Map live = new LinkedHashMap();
        for (int i = 0; i < read.size(); i++) {
            if (read.get(i) == null) {
                return null;
            }
            List found = (List) read.get(i);
            for (int j = 0; j < found.size(); j++) {
                Object[] action = (Object[]) found.get(j);
                ObjectNode body = (ObjectNode) action[1];
                body.put("path", (String) canonical.apply(body.get("path").asText()));
                String key = body.get("path").asText() + "\n" + vectorId(body.get("deletionVector"));
                if ("add".equals(action[0])) {
                    body.put("dataChange", false);
                    live.put(key, body);
                } else {
                    live.remove(key);
                }
            }
        }
        List out = new ArrayList();
        for (Iterator it = live.values().iterator(); it.hasNext();) {
            ObjectNode wrapped = JSON.createObjectNode();
            wrapped.set("add", (JsonNode) it.next());
            out.add(org.apache.spark.sql.delta.actions.Action$.MODULE$.fromJson(JSON.writeValueAsString(wrapped)));
        }
        return out;
    }

    /** A deletion vector's unique id as Delta keys a file by it (storage type, path or inline bytes, offset). */
    private static String vectorId(JsonNode vector) {
        if (vector == null || vector.isNull()) {
            return "";
        }
        JsonNode offset = vector.get("offset");
        return text(vector.get("storageType")) + text(vector.get("pathOrInlineDv"))
            + (offset == null || offset.isNull() ? "" : "@" + offset.asText());
    }

    private static String text(JsonNode node) {
        return node == null ? "" : node.asText();
    }

    /** For each of `files`, its [kind, body] actions of `kinds`, `READERS` files at a time. */
    private static List readAll(final List files, final List kinds, final Configuration conf) throws Exception {
        ExecutorService pool = Executors.newFixedThreadPool(Math.max(1, Math.min(READERS, files.size())));
        try {
            List futures = new ArrayList();
            for (int i = 0; i < files.size(); i++) {
                final String file = (String) files.get(i);
                futures.add(pool.submit(new Callable() {
                    public Object call() throws Exception {
                        return file.endsWith(".parquet") ? readParquet(file, kinds, conf) : read(file, kinds, conf);
                    }
                }));
            }
            List out = new ArrayList();
            for (int i = 0; i < futures.size(); i++) {
                out.add(((Future) futures.get(i)).get());
            }
            return out;
        } finally {
            pool.shutdownNow();
        }
    }

    private static List read(String file, List kinds, Configuration conf) throws Exception {
        Path path = new Path(file);
        FileSystem fs = path.getFileSystem(conf);
        List out = new ArrayList();
        BufferedReader lines = new BufferedReader(new InputStreamReader(fs.open(path), StandardCharsets.UTF_8));
        try {
            for (String line = lines.readLine(); line != null; line = lines.readLine()) {
                if (line.trim().isEmpty()) {
                    continue;
                }
                JsonNode action = JSON.readTree(line);
                for (int k = 0; k < kinds.size(); k++) {
                    JsonNode body = action.get((String) kinds.get(k));
                    if (body != null && body.has("path")) {
                        out.add(new Object[] {kinds.get(k), body});
                    }
                }
            }
        } finally {
            lines.close();
        }
        return out;
    }

    /**
     * The actions of `kinds` in a Parquet checkpoint (or sidecar), each column of the action read as
     * its JSON field would spell it (maps as objects, absent values left out); null when an action
     * keeps its statistics only as a struct. Only the actions' own columns are read.
     */
    private static List readParquet(String file, List kinds, Configuration conf) throws Exception {
        Path path = new Path(file);
        ParquetFileReader footer = ParquetFileReader.open(HadoopInputFile.fromPath(path, conf));
        MessageType schema;
        try {
            schema = footer.getFooter().getFileMetaData().getSchema();
        } finally {
            footer.close();
        }
        List fields = new ArrayList();
        for (int k = 0; k < kinds.size(); k++) {
            String kind = (String) kinds.get(k);
            if (!schema.containsField(kind)) {
                continue;
            }
            GroupType action = schema.getType(kind).asGroupType();
            if (!action.containsField("stats") && action.containsField("stats_parsed")) {
                return null;
            }
            List kept = new ArrayList();
            for (int f = 0; f < action.getFieldCount(); f++) {
                if (!action.getType(f).getName().endsWith("_parsed")) {
                    kept.add(action.getType(f));
                }
            }
            fields.add(action.withNewFields(kept));
        }
        List out = new ArrayList();
        if (fields.isEmpty()) {
            return out;
        }
        MessageType projection = new MessageType(schema.getName(), fields);
        Configuration projected = new Configuration(conf);
        projected.set(ReadSupport.PARQUET_READ_SCHEMA, projection.toString());
        ParquetReader reader = ParquetReader.builder(new GroupReadSupport(), path).withConf(projected).build();
        try {
            for (Group row = (Group) reader.read(); row != null; row = (Group) reader.read()) {
                for (int f = 0; f < projection.getFieldCount(); f++) {
                    if (row.getFieldRepetitionCount(f) > 0) {
                        out.add(new Object[] {projection.getType(f).getName(),
                            struct((Group) row.getGroup(f, 0), projection.getType(f).asGroupType())});
                    }
                }
            }
        } finally {
            reader.close();
        }
        return out;
    }

    private static ObjectNode struct(Group group, GroupType type) {
        ObjectNode out = JSON.createObjectNode();
        for (int f = 0; f < type.getFieldCount(); f++) {
            if (group.getFieldRepetitionCount(f) == 0) {
                continue;
            }
            Type field = type.getType(f);
            if (field.isPrimitive()) {
                out.set(field.getName(), primitive(group, f, 0, field.asPrimitiveType()));
            } else if (field.getLogicalTypeAnnotation() instanceof LogicalTypeAnnotation.MapLogicalTypeAnnotation) {
                ObjectNode map = JSON.createObjectNode();
                Group entries = (Group) group.getGroup(f, 0);
                GroupType entry = field.asGroupType().getType(0).asGroupType();
                for (int e = 0; e < entries.getFieldRepetitionCount(0); e++) {
                    Group pair = (Group) entries.getGroup(0, e);
                    String key = pair.getString(0, 0);
                    if (pair.getFieldRepetitionCount(1) == 0) {
                        map.putNull(key);
                    } else {
                        map.set(key, primitive(pair, 1, 0, entry.getType(1).asPrimitiveType()));
                    }
                }
                out.set(field.getName(), map);
            } else {
                out.set(field.getName(), struct((Group) group.getGroup(f, 0), field.asGroupType()));
            }
        }
        return out;
    }

    private static JsonNode primitive(Group group, int field, int index, PrimitiveType type) {
        PrimitiveType.PrimitiveTypeName name = type.getPrimitiveTypeName();
        if (name == PrimitiveType.PrimitiveTypeName.INT64) {
            return JSON.getNodeFactory().numberNode(group.getLong(field, index));
        }
        if (name == PrimitiveType.PrimitiveTypeName.INT32) {
            return JSON.getNodeFactory().numberNode(group.getInteger(field, index));
        }
        if (name == PrimitiveType.PrimitiveTypeName.BOOLEAN) {
            return JSON.getNodeFactory().booleanNode(group.getBoolean(field, index));
        }
        if (name == PrimitiveType.PrimitiveTypeName.DOUBLE) {
            return JSON.getNodeFactory().numberNode(group.getDouble(field, index));
        }
        return JSON.getNodeFactory().textNode(group.getString(field, index));
    }

    private static Long records(JsonNode body) throws Exception {
        JsonNode raw = body.get("stats");
        if (raw == null || raw.isNull()) {
            return null;
        }
        JsonNode count = JSON.readTree(raw.asText()).get("numRecords");
        return count == null || count.isNull() ? null : Long.valueOf(count.asLong());
    }
}
