// Whether a row's key is one of a batch's values, and which requests name it, answered inside
// Spark's generated code for lakehouse-dsr (membership.py): a table lookup where a broadcast join
// would build a key row, hash it and probe a hashed relation for every row. Spark's stock Invoke
// (catalyst.py) calls `test` through java.util.function.Predicate (`apply` through Function; a bigint or int key
// boxed), so generated code names no class of ours; the values travel as a broadcast variable
// (fetched once per executor, cached per deserialized copy), never as plan literals, and the
// literals' text is "membership" or "requesters", so no value reaches a plan string. Compiled by
// Janino (bridge.py): raw types throughout.
package lakehouse_dsr;

import com.fasterxml.jackson.databind.ObjectMapper;
import java.util.HashMap;
import java.util.Iterator;
import java.util.List;
import java.util.Map;
import java.util.function.Function;
import java.util.function.Predicate;
import org.apache.spark.SparkContext;
import org.apache.spark.TaskContext;
import org.apache.spark.api.java.JavaSparkContext;
import org.apache.spark.broadcast.Broadcast;
import org.apache.spark.sql.Dataset;
import org.apache.spark.sql.catalyst.InternalRow;
import org.apache.spark.sql.catalyst.util.GenericArrayData;
import org.apache.spark.unsafe.Platform;
import org.apache.spark.unsafe.types.UTF8String;
import org.apache.spark.util.CollectionAccumulator;
import org.apache.spark.util.TaskCompletionListener;

public class Membership implements Predicate, java.io.Serializable {
  private final Broadcast values;
  private transient Keys held;  // the broadcast's keys: TorrentBroadcast.value() synchronizes every call

  public Membership() { this.values = null; }

  private Membership(Broadcast values) { this.values = values; }

  private Keys held() {
    if (held == null) {
      held = new Keys((Object[]) values.value());
    }
    return held;
  }

  /** A UTF8String, Long or Integer key. */
  public boolean test(Object value) { return held().get(value) != null; }

  public String toString() { return "membership"; }

  /** A broadcast table of `values` (Java strings, longs or integers, keys of `type`: "string", "bigint"
   *  or "int"), for `memberOf`. */
  public Broadcast table(SparkContext sc, List values, String type) {
    Keys keys = new Keys(values.size());
    for (int i = 0; i < values.size(); i++) {
      keys.put(probe(values.get(i), type), Boolean.TRUE);
    }
    return new JavaSparkContext(sc).broadcast(keys.arrays());
  }

  /** The object whose `apply` gives the ids of the requests naming a key (of `type`) as `lookup` lists
   *  them (a value -> sorted request ids map: InDriver.lookup's), as Spark's array<string>, or null
   *  where none does: what a broadcast join with the lookup's rows would add, without building and
   *  probing a key row. */
  public Function requesters(SparkContext sc, Map lookup, String type) {
    return new Requesters(new JavaSparkContext(sc).broadcast(byValue(lookup, type).arrays()));
  }

  /** A Counter of the rows whose key (of `type`) is one of `lookup`'s values (a value -> sorted request
   *  ids map: InDriver.lookup's), per value, while an action reads them. */
  public Counter counter(SparkContext sc, Map lookup, String type) {
    return counter(sc, byValue(lookup, type));
  }

  /** The values (of `type`) in the first column of `values`, collected into the driver as Spark's
   *  own rows (one job; no conversion to Java objects and back), as one broadcast table of each
   *  value's ordinal in that order, which membership tests (`memberOf`) and counters (`counterOn`)
   *  share: for a set too large to hold with its request ids (`lookup`). The driver holds the values
   *  and no request id. */
  public Broadcast positions(SparkContext sc, Dataset values, String type) {
    Object[] rows = (Object[]) values.queryExecution().executedPlan().executeCollect();
    Keys byValue = new Keys(rows.length);
    for (int i = 0; i < rows.length; i++) {
      InternalRow row = (InternalRow) rows[i];
      if (row.isNullAt(0)) {
        continue;
      }
      Object value = type.equals("string") ? (Object) row.getUTF8String(0)
          : type.equals("bigint") ? (Object) Long.valueOf(row.getLong(0)) : (Object) Integer.valueOf(row.getInt(0));
      byValue.put(value, Integer.valueOf(i));
    }
    return new JavaSparkContext(sc).broadcast(byValue.arrays());
  }

  /** The object whose `test` tells whether a key is in a broadcast table (`table`'s, or `positions'`). */
  public Predicate memberOf(Broadcast positions) { return new Membership(positions); }

  /** A Counter over a `positions` table: each value counted by its ordinal (`byOrdinal`). */
  public Counter counterOn(SparkContext sc, Broadcast positions) {
    return new Counter(new Keys((Object[]) positions.value()), positions,
        sc.collectionAccumulator("dsr: requested rows counted"));
  }

  private static Counter counter(SparkContext sc, Keys byValue) {
    CollectionAccumulator counts = sc.collectionAccumulator("dsr: requested rows counted");
    Object[] arrays = byValue.arrays();
    // Tasks need the values only: the request ids stay in the driver.
    Broadcast table = new JavaSparkContext(sc).broadcast(new Object[] {arrays[0], arrays[1], null});
    return new Counter(byValue, table, counts);
  }

  /** `lookup`'s values (of `type`), each mapped to its request ids as Spark's array<string>. */
  private static Keys byValue(Map lookup, String type) {
    Keys byValue = new Keys(lookup.size());
    for (Iterator it = lookup.entrySet().iterator(); it.hasNext();) {
      Map.Entry entry = (Map.Entry) it.next();
      List ids = (List) entry.getValue();
      Object[] items = new Object[ids.size()];
      for (int i = 0; i < items.length; i++) {
        items[i] = UTF8String.fromString((String) ids.get(i));
      }
      byValue.put(probe(entry.getKey(), type), new GenericArrayData(items));
    }
    return byValue;
  }

  /** A value as generated code hands it to `test` or `apply`: a UTF8String, or a boxed bigint or int. */
  private static Object probe(Object value, String type) {
    if (type.equals("string")) {
      return UTF8String.fromString((String) value);
    } else if (type.equals("bigint")) {
      return Long.valueOf(((Number) value).longValue());
    } else if (type.equals("int")) {
      return Integer.valueOf(((Number) value).intValue());
    }
    throw new IllegalArgumentException("no membership test for keys of type " + type);
  }

  /** The request ids by value, looked up inside generated code (see `requesters`). */
  static class Requesters implements Function, java.io.Serializable {
    private final Broadcast byValue;
    private transient Keys held;

    Requesters(Broadcast byValue) { this.byValue = byValue; }

    public Object apply(Object value) {
      if (held == null) {
        held = new Keys((Object[]) byValue.value());
      }
      return held.get(value);
    }

    public String toString() { return "requesters"; }
  }

  /** Rows counted per requested value while an action reads them (see `counter`), and what the
   *  counts add up to per request, in the driver. */
  public static class Counter {
    private final Keys byValue;  // slot -> the request ids naming its value, as `requesters` (driver only)
    private final Broadcast table;
    private final CollectionAccumulator counts;  // each finished task's (slot, rows) pairs

    Counter(Keys byValue, Broadcast table, CollectionAccumulator counts) {
      this.byValue = byValue;
      this.table = table;
      this.counts = counts;
    }

    /** The object whose `test` counts each row whose key is one of the values (always true). */
    public Predicate counting() { return new Counting(table, counts); }

    /** The rows counted per value of a `counterOn` counter, as little-endian longs: the values'
     *  ordinals, then their rows (as many), for the values counted at least once. */
    public byte[] byOrdinal() {
      Map rows = new HashMap();  // Integer ordinal -> long[1]
      for (Iterator it = counts.value().iterator(); it.hasNext();) {
        long[] pairs = (long[]) it.next();
        for (int i = 0; i < pairs.length; i += 2) {
          Object ordinal = byValue.found((int) pairs[i]);
          long[] sum = (long[]) rows.get(ordinal);
          if (sum == null) {
            sum = new long[1];
            rows.put(ordinal, sum);
          }
          sum[0] += pairs[i + 1];
        }
      }
      java.nio.ByteBuffer out = java.nio.ByteBuffer.allocate(rows.size() * 16).order(java.nio.ByteOrder.LITTLE_ENDIAN);
      int i = 0;
      for (Iterator it = rows.entrySet().iterator(); it.hasNext(); i++) {
        Map.Entry entry = (Map.Entry) it.next();
        out.putLong(i * 8, ((Integer) entry.getKey()).longValue());
        out.putLong((rows.size() + i) * 8, ((long[]) entry.getValue())[0]);
      }
      return out.array();
    }

    /** The rows counted, per request id naming their value (a row named by two requests counts for
     *  each), as JSON: {"total": every row counted once, "requests": {id: rows}}. */
    public String byRequest() throws Exception {
      Map rows = new HashMap();
      long total = 0L;
      for (Iterator it = counts.value().iterator(); it.hasNext();) {
        long[] pairs = (long[]) it.next();
        for (int i = 0; i < pairs.length; i += 2) {
          total += pairs[i + 1];
          Object[] ids = ((GenericArrayData) byValue.found((int) pairs[i])).array();
          for (int j = 0; j < ids.length; j++) {
            String id = ids[j].toString();
            Long before = (Long) rows.get(id);
            rows.put(id, Long.valueOf((before == null ? 0L : before.longValue()) + pairs[i + 1]));
          }
        }
      }
      Map out = new HashMap();
      out.put("total", Long.valueOf(total));
      out.put("requests", rows);
      return new ObjectMapper().writeValueAsString(out);
    }
  }

  /** A task's side of a Counter: its rows per slot, added to the accumulator when the task completes
   *  (Spark merges a successful task's accumulator updates once). */
  static class Counting implements Predicate, TaskCompletionListener, java.io.Serializable {
    private final Broadcast table;
    private final CollectionAccumulator counts;
    private transient Keys held;
    private transient Map hits;  // Integer slot -> long[1]: requested rows are few
    private transient boolean inDriver;

    Counting(Broadcast table, CollectionAccumulator counts) {
      this.table = table;
      this.counts = counts;
    }

    public boolean test(Object value) {
      if (held == null) {
        held = new Keys((Object[]) table.value());
        hits = new HashMap();
        TaskContext task = TaskContext.get();
        inDriver = task == null;
        if (!inDriver) {
          task.addTaskCompletionListener(this);
        }
      }
      int slot = held.slot(value);
      if (slot >= 0 && inDriver) {  // evaluated outside a task (Spark's optimizer): no task end to wait for
        counts.add(new long[] {slot, 1L});
      } else if (slot >= 0) {
        Integer at = Integer.valueOf(slot);
        long[] rows = (long[]) hits.get(at);
        if (rows == null) {
          rows = new long[1];
          hits.put(at, rows);
        }
        rows[0]++;
      }
      return true;
    }

    public void onTaskCompletion(TaskContext context) {
      long[] pairs = new long[hits.size() * 2];
      int i = 0;
      for (Iterator it = hits.entrySet().iterator(); it.hasNext(); i += 2) {
        Map.Entry entry = (Map.Entry) it.next();
        pairs[i] = ((Integer) entry.getKey()).longValue();
        pairs[i + 1] = ((long[]) entry.getValue())[0];
      }
      counts.add(pairs);
    }

    public String toString() { return "counting"; }
  }

  /** Values (UTF8Strings, Longs or Integers, one type per table) and what each maps to, in open
   *  addressing over 64-bit fingerprints: a string's bytes read eight at a time, a number mixed.
   *  A probe for a key no request names (nearly every row of a scan) computes the fingerprint and
   *  reads one long, where a java.util.HashSet ran UTF8String's Murmur3 over every byte, then
   *  followed an entry (three lookups a row over a 10M-row scan, warm: 0.19-0.35 s against
   *  0.32-0.43 s). A fingerprint that matches is confirmed with equals: a collision costs time,
   *  never a wrong answer. */
  static final class Keys {
    private final long[] prints;  // 0: an empty slot
    private final Object[] values;  // as put, in the driver; null in a table from `arrays`
    private final byte[] text;  // from `arrays`: the string values' bytes, slot after slot
    private final int[] ends;  // from `arrays`: where each slot's string ends in `text`
    private final long[] numbers;  // from `arrays`: the number values, slot by slot
    private final Object[] found;  // what each value maps to (from `arrays`: where neither below)
    private final int[] ordinals;  // from `arrays`: what each value maps to, where all are Integers (-1: none)
    private final Object same;  // from `arrays`: what every value maps to, where all map to one object
    private final int mask;

    Keys(int size) {
      // Half full at most: a probe for a value not held then reads 2.5 slots on average, and a
      // million values take 2M slots, 32 MB with their references (a HashSet's entries, 40 MB).
      int slots = Integer.highestOneBit(Math.max(8, size * 2) - 1) << 1;
      prints = new long[slots];
      values = new Object[slots];
      found = new Object[slots];
      text = null;
      ends = null;
      numbers = null;
      ordinals = null;
      same = null;
      mask = slots - 1;
    }

    /** The table as `arrays` made it: on an executor, from the broadcast. */
    Keys(Object[] arrays) {
      prints = (long[]) arrays[0];
      values = null;
      if (arrays[1] instanceof long[]) {
        numbers = (long[]) arrays[1];
        text = null;
        ends = null;
      } else {
        numbers = null;
        text = (byte[]) ((Object[]) arrays[1])[0];
        ends = (int[]) ((Object[]) arrays[1])[1];
      }
      found = arrays[2] instanceof Object[] ? (Object[]) arrays[2] : null;
      ordinals = arrays[2] instanceof int[] ? (int[]) arrays[2] : null;
      same = found == null && ordinals == null ? arrays[2] : null;
      mask = prints.length - 1;
    }

    /** The table as arrays of JDK and Spark types, for a broadcast: a class of ours in it would be
     *  the driver's copy, which a task's copy of the class cannot cast (another class loader). The
     *  values and what they map to go as primitive arrays where they can (strings as their bytes,
     *  numbers as longs, ordinals as ints): Java's serialization writes a million objects in
     *  seconds, a primitive array at the speed of a copy. */
    Object[] arrays() { return new Object[] {prints, packedValues(), packedFound()}; }

    private Object packedValues() {
      boolean strings = false;
      for (int i = 0; i < values.length; i++) {
        if (values[i] != null) {
          strings = values[i] instanceof UTF8String;
          break;
        }
      }
      if (!strings) {
        long[] out = new long[values.length];
        for (int i = 0; i < values.length; i++) {
          out[i] = values[i] == null ? 0L : ((Number) values[i]).longValue();
        }
        return out;
      }
      int total = 0;
      for (int i = 0; i < values.length; i++) {
        total += values[i] == null ? 0 : ((UTF8String) values[i]).numBytes();
      }
      byte[] bytes = new byte[total];
      int[] until = new int[values.length];
      int at = 0;
      for (int i = 0; i < values.length; i++) {
        if (values[i] != null) {
          UTF8String value = (UTF8String) values[i];
          value.writeToMemory(bytes, Platform.BYTE_ARRAY_OFFSET + at);
          at += value.numBytes();
        }
        until[i] = at;
      }
      return new Object[] {bytes, until};
    }

    private Object packedFound() {
      Object first = null;
      boolean one = true;
      boolean integers = true;
      for (int i = 0; i < found.length; i++) {
        if (found[i] != null) {
          first = first == null ? found[i] : first;
          one = one && found[i] == first;
          integers = integers && found[i] instanceof Integer;
        }
      }
      if (first == null) {
        return null;
      }
      if (integers) {
        int[] out = new int[found.length];
        for (int i = 0; i < found.length; i++) {
          out[i] = found[i] == null ? -1 : ((Integer) found[i]).intValue();
        }
        return out;
      }
      return one ? first : (Object) found;
    }

    void put(Object value, Object result) {
      long print = print(value);
      int i = (int) print & mask;
      while (prints[i] != 0L && !(prints[i] == print && values[i].equals(value))) {
        i = (i + 1) & mask;
      }
      prints[i] = print;
      values[i] = value;
      found[i] = result;
    }

    /** What `value` maps to; null for a value the table does not hold. */
    Object get(Object value) {
      int i = slot(value);
      return i < 0 ? null : found(i);
    }

    /** What the value at `slot` maps to. */
    Object found(int slot) {
      return found != null ? found[slot] : ordinals != null ? (Object) Integer.valueOf(ordinals[slot]) : same;
    }

    /** Where the table holds `value`; -1 where it does not. */
    int slot(Object value) {
      long print = print(value);
      int i = (int) print & mask;
      while (true) {
        long at = prints[i];
        if (at == 0L) {
          return -1;
        }
        if (at == print && holds(i, value)) {
          return i;
        }
        i = (i + 1) & mask;
      }
    }

    /** Whether `slot` holds `value` (its fingerprint matched). */
    private boolean holds(int slot, Object value) {
      if (values != null) {
        return values[slot].equals(value);
      }
      if (numbers != null) {
        return numbers[slot] == ((Number) value).longValue();
      }
      int start = slot == 0 ? 0 : ends[slot - 1];
      return value.equals(UTF8String.fromBytes(text, start, ends[slot] - start));
    }

    private static long print(Object value) {
      long h;
      if (value instanceof UTF8String) {
        UTF8String text = (UTF8String) value;
        Object base = text.getBaseObject();
        long offset = text.getBaseOffset();
        int length = text.numBytes();
        h = length * 0x9E3779B97F4A7C15L;
        int i = 0;
        for (; i + 8 <= length; i += 8) {
          h = (h ^ Platform.getLong(base, offset + i)) * 0xff51afd7ed558ccdL;
          h ^= h >>> 29;
        }
        long tail = 0L;
        for (; i < length; i++) {
          tail = (tail << 8) | (Platform.getByte(base, offset + i) & 0xffL);
        }
        h ^= tail;
      } else {
        h = ((Number) value).longValue();
      }
      h = (h ^ (h >>> 33)) * 0xc4ceb9fe1a85ec53L;  // murmur3's finalizer: every bit reaches the slot
      h = (h ^ (h >>> 33)) * 0xff51afd7ed558ccdL;
      h ^= h >>> 33;
      return h == 0L ? 1L : h;
    }
  }
}
